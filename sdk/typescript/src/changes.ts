/**
 * Waiting for a stream's reader to change something (a terminal's output, a watch's events): `notify` wakes
 * every `until`, which checks its condition again. The Python SDK's `_Changes`.
 */
import { InvalidArgument } from "./errors.js";

export class Changes {
  private readonly waiters = new Set<() => void>();

  /** Wakes every waiter. */
  notify(): void {
    const waiting = [...this.waiters];
    this.waiters.clear();
    for (const wake of waiting) wake();
  }

  /** Resolves at the next `notify`, or after `timeoutMs` when one is given. */
  next(timeoutMs?: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        if (timer !== undefined) clearTimeout(timer);
        this.waiters.delete(done);
        resolve();
      };
      const timer = timeoutMs === undefined ? undefined : setTimeout(done, timeoutMs);
      this.waiters.add(done);
    });
  }

  /** Waits until `ready()`; false when `timeoutMs` passed first; rejects with the signal's reason. */
  async until(ready: () => boolean, timeoutMs: number | undefined, signal?: AbortSignal): Promise<boolean> {
    if (timeoutMs !== undefined && (typeof timeoutMs !== "number" || !(timeoutMs >= 0))) {
      throw new InvalidArgument(`timeoutMs must be a number of milliseconds, not ${String(timeoutMs)}`, {
        field: "timeoutMs",
      });
    }
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    while (!ready()) {
      signal?.throwIfAborted();
      const left = deadline === undefined ? undefined : deadline - Date.now();
      if (left !== undefined && left <= 0) return false;
      await new Promise<void>((resolve, reject) => {
        const cleanUp = () => {
          if (timer !== undefined) clearTimeout(timer);
          signal?.removeEventListener("abort", abort);
          this.waiters.delete(wake);
        };
        const wake = () => {
          cleanUp();
          resolve();
        };
        const abort = () => {
          cleanUp();
          reject(signal?.reason);
        };
        // setTimeout takes at most 2^31-1 ms (beyond, it fires at once): a longer wait takes several.
        const timer = left === undefined ? undefined : setTimeout(wake, Math.min(left, 2 ** 31 - 1));
        signal?.addEventListener("abort", abort, { once: true });
        this.waiters.add(wake);
      });
    }
    return true;
  }
}
