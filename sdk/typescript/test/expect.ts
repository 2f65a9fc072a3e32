/** Small assertions the SDK's tests share. */
import assert from "node:assert/strict";
import { MentisError } from "mentis-sandbox";

/** The typed error `promise` rejects with, checked to be a `cls` with the `reason` and `field` given. */
export async function refused<T extends MentisError>(
  promise: Promise<unknown>,
  cls: abstract new (...args: never[]) => T,
  check: { reason?: string; field?: string } = {},
): Promise<T> {
  let value: unknown;
  try {
    value = await promise;
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${String(e)}`);
    if (check.reason !== undefined) assert.equal(e.reason, check.reason, String(e));
    if (check.field !== undefined) assert.equal(e.field, check.field, String(e));
    return e;
  }
  assert.fail(`expected ${cls.name}; it resolved with ${String(value)}`);
}

/** Resolves once `check()` is true, checking every `everyMs`; fails after `timeoutMs`. */
export async function soon(check: () => Promise<boolean> | boolean, what: string, timeoutMs = 10_000, everyMs = 50): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    assert.ok(Date.now() < deadline, `${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
