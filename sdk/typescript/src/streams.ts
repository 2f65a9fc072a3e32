/**
 * A broken connection, told apart from the runtime's answers: Connect-Node gives a connection that was reset
 * (ECONNRESET, a stream destroyed under the call) as ABORTED, with Node's error as its cause, where gRPC means
 * UNAVAILABLE (the runtime itself never answers ABORTED). Streams that resume by themselves (a watch) take it
 * as one to resume after; everything else sees it as `Unavailable`.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { fromConnectError, InvalidArgument, MentisError, Unavailable } from "./errors.js";

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

/**
 * A client stream (WriteFile, Upload, BuildImage, ImportImage): `header`, a message (`message`) per piece of
 * `pieces`, then the clean end that commits it. A piece that cannot be had (a local file that cannot be read)
 * resets the call instead, so nothing half sent is committed, and its error is thrown; so is the caller's abort.
 * Only a failure to read is local: the transport's own (the runtime ended the call early, and says why) goes out
 * as a typed error. The call ends with this function, also when `call` returned early or threw.
 */
export async function sendStream<Req, R>(
  call: (requests: AsyncIterable<Req>, signal: AbortSignal) => Promise<R>,
  header: Req,
  pieces: AsyncIterable<Uint8Array>,
  message: (data: Uint8Array) => Req,
  signal: AbortSignal | undefined,
): Promise<R> {
  signal?.throwIfAborted();
  const controller = new AbortController();
  let local: { error: unknown } | undefined;
  const source = pieces[Symbol.asyncIterator]();
  async function* requests(): AsyncGenerator<Req> {
    yield header;
    try {
      for (;;) {
        let next: IteratorResult<Uint8Array>;
        try {
          next = await source.next();
          if (!next.done && !(next.value instanceof Uint8Array)) {
            throw new InvalidArgument("a piece of the data is not a Uint8Array");
          }
        } catch (e) {
          local = { error: e };
          controller.abort(e);
          throw e;
        }
        if (next.done) return;
        yield message(next.value);
      }
    } finally {
      await source.return?.(undefined);
    }
  }
  const forward = () => controller.abort(signal?.reason);
  signal?.addEventListener("abort", forward, { once: true });
  try {
    return await call(requests(), controller.signal);
  } catch (e) {
    if (local) throw local.error;
    if (signal?.aborted) throw signal.reason;
    throw streamError(e);
  } finally {
    signal?.removeEventListener("abort", forward);
    controller.abort();
  }
}
