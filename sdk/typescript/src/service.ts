/**
 * The connection of a class that is no sandbox (`Snapshots`, `Templates`, `Secrets`): one of its own, opened at
 * its first call with the same options and defaults as `Sandbox.create`, or one it was given (a sandbox's
 * `connection`), which it then leaves open.
 */
import { Connection, type ConnectionOptions } from "./client.js";
import { FailedPrecondition, InvalidArgument } from "./errors.js";

/** Where a class that is no sandbox reaches the runtime: options for a connection of its own, or `connection`. */
export interface ServiceOptions extends ConnectionOptions {
  /** An open connection to use (a sandbox's `connection`), left open by `close()`. */
  connection?: Connection;
}

/** A connection opened on first use (or given), closed by `close()` when it is this object's own. */
export class ServiceConnection {
  private opening: Promise<Connection> | undefined;
  private closed = false;
  private readonly own: boolean;
  private readonly options: ConnectionOptions;

  constructor(source: ServiceOptions | Connection, private readonly what: string) {
    const given = source instanceof Connection ? source : source.connection;
    this.own = given === undefined;
    this.options = source instanceof Connection ? {} : source;
    if (given) this.opening = Promise.resolve(given);
  }

  /** The connection (opened now, at the first call). */
  get(): Promise<Connection> {
    if (this.closed) return Promise.reject(new FailedPrecondition(`this ${this.what} was closed`));
    this.opening ??= Connection.open(this.options);
    return this.opening;
  }

  /** `call(conn)`'s result, its failure as a typed error. */
  async call<T>(call: (conn: Connection) => Promise<T>): Promise<T> {
    const conn = await this.get();
    return conn.call(() => call(conn));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const opening = this.opening;
    if (!this.own || !opening) return;
    try {
      (await opening).close();
    } catch {
      // It never opened: nothing to close.
    }
  }
}

/** `value` as a whole number for an int64 field (0n when not given); InvalidArgument naming `field` otherwise. */
export function int64(value: number | undefined, field: string): bigint {
  if (value === undefined) return 0n;
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    throw new InvalidArgument(`${field} must be a whole number, not ${String(value)}`, { field });
  }
  return BigInt(value);
}

/** `value` as a 32-bit field's number (0 when not given), `low` to `high`; InvalidArgument naming `field`
 * otherwise. */
export function int32(value: number | undefined, field: string, low = 0, high = 0x7fff_ffff): number {
  if (value === undefined) return 0;
  if (typeof value !== "number" || !Number.isInteger(value) || value < low || value > high) {
    throw new InvalidArgument(`${field} must be a whole number from ${low} to ${high}, not ${String(value)}`, {
      field,
    });
  }
  return value;
}

/** `value` as a string field ("" when not given); InvalidArgument naming `field` otherwise. */
export function str(value: string | undefined, field: string): string {
  if (value === undefined) return "";
  if (typeof value !== "string") throw new InvalidArgument(`${field} must be a string`, { field });
  return value;
}

/** `value` as a map of strings ({} when not given); InvalidArgument naming `field` otherwise. */
export function strings(value: Record<string, string> | undefined, field: string): Record<string, string> {
  if (value === undefined) return {};
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new InvalidArgument(`${field} must be an object of strings`, { field });
  }
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== "string") throw new InvalidArgument(`${field}.${k} must be a string`, { field });
  }
  return value;
}
