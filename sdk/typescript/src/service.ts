/**
 * The connection of a class that is no sandbox (`Snapshots`, `Templates`, `Secrets`): one of its own, opened at
 * its first call with the same options and defaults as `Sandbox.create`, or one it was given (a sandbox's
 * `connection`), which it then leaves open.
 */
import { Connection, type ConnectionOptions } from "./client.js";
import { FailedPrecondition } from "./errors.js";

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
