/**
 * Checks of a caller's arguments before any call: a JavaScript caller may pass anything, and a wrong value gets
 * InvalidArgument naming its option (`field`), never a TypeError from deep inside or a runtime's INTERNAL.
 */
import { InvalidArgument } from "./errors.js";

/** A value as an error message shows it. */
export function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (typeof value === "bigint") return `${value}n`;
  return typeof value === "object" && value !== null ? (value.constructor?.name ?? "an object") : String(value);
}

/** A string argument that must be given. */
export function text(value: unknown, field: string): string {
  if (typeof value !== "string") {
    throw new InvalidArgument(`${field} must be a string, not ${describe(value)}`, { field });
  }
  return value;
}

/** A string option ("" when not given). */
export function str(value: string | undefined, field: string): string {
  return value === undefined ? "" : text(value, field);
}

/** A map of strings ({} when not given). */
export function strings(value: Record<string, string> | undefined, field: string): Record<string, string> {
  if (value === undefined) return {};
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new InvalidArgument(`${field} must be an object of strings, not ${describe(value)}`, { field });
  }
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== "string") throw new InvalidArgument(`${field}.${k} must be a string`, { field });
  }
  return value;
}

/** A true-or-false option (false when not given). */
export function flag(value: unknown, field: string): boolean {
  if (value !== undefined && typeof value !== "boolean") {
    throw new InvalidArgument(`${field} must be true or false, not ${describe(value)}`, { field });
  }
  return value ?? false;
}

function inRange(value: unknown, field: string, low: number, high: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < low || value > high) {
    throw new InvalidArgument(`${field} must be a whole number from ${low} to ${high}, not ${describe(value)}`, {
      field,
    });
  }
  return value;
}

/** A whole number from 0 to `max` that must be given. */
export function whole(value: unknown, field: string, max = Number.MAX_SAFE_INTEGER): number {
  return inRange(value, field, 0, max);
}

/** A 32-bit field's number (0 when not given), `low` to `high`. */
export function int32(value: number | undefined, field: string, low = 0, high = 0x7fff_ffff): number {
  return value === undefined ? 0 : inRange(value, field, low, high);
}

/** A whole number for an int64 field (0n when not given). */
export function int64(value: number | undefined, field: string): bigint {
  return value === undefined ? 0n : BigInt(inRange(value, field, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER));
}
