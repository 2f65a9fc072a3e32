/**
 * A broken connection, told apart from the runtime's answers: Connect-Node gives a connection that was reset
 * (ECONNRESET, a stream destroyed under the call) as ABORTED, with Node's error as its cause, where gRPC means
 * UNAVAILABLE (the runtime itself never answers ABORTED). Streams that resume by themselves (a watch) take it
 * as one to resume after; everything else sees it as `Unavailable`.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { fromConnectError, MentisError, Unavailable } from "./errors.js";

/** Whether `e` is the connection failing under a call, not the runtime's answer. */
export function brokenConnection(e: unknown): boolean {
  const err = ConnectError.from(e);
  if (err.code === Code.Unavailable) return true;
  if (err.code !== Code.Aborted && err.code !== Code.Internal) return false;
  for (let c: unknown = err.cause; c; c = (c as { cause?: unknown }).cause) {
    const code = (c as { code?: unknown }).code;
    // A response the runtime sent while the request was still being written is its answer, not a break.
    if (code === "ERR_STREAM_WRITE_AFTER_END") return false;
    if (typeof code !== "string") continue;
    if (/^E[A-Z]+$/.test(code) || code.startsWith("ERR_HTTP2_") || code === "ERR_STREAM_DESTROYED") return true;
  }
  return false;
}

/** The typed error of a failed call: `Unavailable` for a broken connection, else `fromConnectError`'s. */
export function streamError(e: unknown): MentisError {
  if (e instanceof MentisError || !brokenConnection(e)) return fromConnectError(e);
  const err = ConnectError.from(e);
  return err.code === Code.Unavailable ? fromConnectError(e) : new Unavailable(err.rawMessage, { cause: e });
}
