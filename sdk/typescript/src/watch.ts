/**
 * Watching a directory of a sandbox's workspace (FileService.WatchFiles).
 *
 *     await sb.files.mkdir("src");
 *     await using watch = await sb.files.watch("src", { recursive: true });
 *     await sb.run("echo 'print(1)' > src/app.py");
 *     for await (const event of watch) {
 *       console.log(event.type, event.path); // created src/app.py, modified src/app.py
 *       if (event.type === "modified") break;
 *     }
 *
 * A watch lives in the sandbox, apart from the stream that reads it (docs/FILES.md, "Watch a folder"): a stream
 * that drops is opened again with the watch's id after the last event received, so each event arrives once and
 * none is skipped. `close()` ends this reader; the watch itself stays in the sandbox for 5 minutes, keeping its
 * newest 4096 events, and `sb.files.attachWatch(watch.watchId, { afterSeq: watch.lastSeq })` reads on from
 * there, in this process or another.
 */
import { Changes } from "./changes.js";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { FileEventType as FileEventTypeEnum, type WatchFilesResponse } from "./gen/mentis/v1/file_pb.js";
import type { Connection } from "./client.js";
import { RESUME_FOR_MS, RETRY_PAUSE_MS } from "./actions.js";
import { MentisError } from "./errors.js";
import { streamError } from "./streams.js";


/**
 * What happened: `"created"` (made, moved in, or replaced whole), `"modified"` (written to), `"removed"`
 * (deleted or moved away), `"overflow"` (events were lost in the sandbox's kernel, or the directory at `path`
 * could not be followed), `"gap"` (this reader fell behind what the watch keeps: `missed` events are gone), or
 * `"unknown"` (a kind this SDK does not know).
 */
export type FileEventType = "created" | "modified" | "removed" | "overflow" | "gap" | "unknown";

/**
 * One change under a watched directory, or a mark where events were lost. A burst of writes to one file is one
 * `modified` at once and one more 50 ms later (so the last write is always reported); a move is `removed` at
 * the old path and `created` at the new one. After an `overflow` or a `gap`, list the directory to catch up.
 */
export interface FileEvent {
  /** Numbers the watch's events from 1 (a gap: the last event lost). */
  seq: number;
  type: FileEventType;
  /** Relative to /workspace, as `FileInfo.path` ("" for a gap, and for an overflow of the whole watch). */
  path: string;
  isDir: boolean;
  /** When the change was seen (undefined for a gap). */
  time: Date | undefined;
  /** For a gap: how many events are gone (0 otherwise). */
  missed: number;
}

/** WatchFiles' request: a new watch of `path`, or a watch read again by its id. */
export type WatchRequest =
  | { sandboxId: string; path: string; recursive: boolean }
  | { sandboxId: string; watchId: string; afterSeq: bigint };

interface Stream {
  call: AbortController;
  it: AsyncIterator<WatchFilesResponse>;
  watchId: string;
}

/** Opens a stream and returns it once its `started` came (the watch exists: every change from then on is
 * reported); typed errors. */
async function openStream(conn: Connection, request: WatchRequest): Promise<Stream> {
  const call = new AbortController();
  try {
    const it = conn.files.watchFiles(request, { signal: call.signal })[Symbol.asyncIterator]();
    for (;;) {
      const r = await it.next();
      if (r.done) throw new MentisError("the watch's stream ended before it started");
      if (r.value.kind.case === "started") return { call, it, watchId: r.value.kind.value.watchId };
    }
  } catch (e) {
    call.abort();
    throw streamError(e);
  }
}

/** A failure a watch gets past by opening its stream again: the connection broke, or the runtime is
 * restarting. */
function resumable(e: MentisError): boolean {
  return e.code === "UNAVAILABLE" || e.code === "CANCELLED";
}

function typeName(type: FileEventTypeEnum): FileEventType {
  if (type === FileEventTypeEnum.UNSPECIFIED) return "unknown";
  return ((FileEventTypeEnum[type] as string | undefined)?.toLowerCase() ?? "unknown") as FileEventType;
}

/**
 * A watch of a directory of the sandbox, made by `sb.files.watch(...)` or `sb.files.attachWatch(...)`.
 *
 * Its events come as `FileEvent`s, in order, each once: iterate over it with `for await` (until it is closed
 * or the watch ends; leaving the loop early loses nothing, the next loop goes on from there), `read()` what
 * arrived, or pass `onEvent` (then nothing is kept to read, and `wait()` says when it ended). It reads its
 * stream in the background and opens it again after a drop (within a minute), after the last event received.
 * `watchId` names the watch in the sandbox and `lastSeq` is the seq of the last event received. `close()` (or
 * `await using`) ends this reader.
 */
export class FileWatch implements AsyncIterable<FileEvent>, AsyncDisposable {
  private buffer: FileEvent[] = [];
  private lastSeq_: number;
  private failure: { error: unknown } | undefined;
  private closed = false;
  private done = false;
  private stream: Stream;
  private readonly changes = new Changes();
  private readonly reading: Promise<void>;

  private constructor(
    private readonly conn: Connection,
    private readonly sandboxId: string,
    stream: Stream,
    afterSeq: number,
    private readonly onEvent: ((event: FileEvent) => void) | undefined,
  ) {
    this.stream = stream;
    this.lastSeq_ = afterSeq;
    this.watchId = stream.watchId;
    this.reading = this.follow().catch((e: unknown) => this.end({ error: e }));
  }

  /** The watch's id in the sandbox: `sb.files.attachWatch(watchId, { afterSeq })` reads it again. */
  readonly watchId: string;

  /** Opens the watch's first stream (`sb.files.watch` and `attachWatch` call this). @internal */
  static async start(
    conn: Connection,
    request: WatchRequest,
    afterSeq: number,
    onEvent: ((event: FileEvent) => void) | undefined,
  ): Promise<FileWatch> {
    return new FileWatch(conn, request.sandboxId, await openStream(conn, request), afterSeq, onEvent);
  }

  /** The seq of the last event received (0: none yet); `attachWatch` goes on after it. */
  get lastSeq(): number {
    return this.lastSeq_;
  }

  toString(): string {
    return `FileWatch(${this.watchId}, lastSeq=${this.lastSeq_})`;
  }

  // --- the stream

  /** Takes one message of the stream; the event new to this reader, if it is one (a started, a keepalive, or
   * an event a resumed stream repeats, is undefined). A gap becomes an event of type "gap" whose seq is the last
   * one lost, so that a stream opened again after it does not report it again. */
  private feed(response: WatchFilesResponse): FileEvent | undefined {
    const kind = response.kind;
    let event: FileEvent;
    if (kind.case === "event") {
      const e = kind.value;
      const seq = Number(e.seq);
      if (seq <= this.lastSeq_) return undefined;
      event = {
        seq,
        type: typeName(e.type),
        path: e.path,
        isDir: e.isDir,
        time: e.time ? timestampDate(e.time) : undefined,
        missed: 0,
      };
    } else if (kind.case === "gap") {
      const lost = Number(kind.value.firstAvailableSeq) - 1;
      if (lost <= this.lastSeq_) return undefined;
      const missed = lost - Math.max(Number(kind.value.afterSeq), this.lastSeq_);
      event = { seq: lost, type: "gap", path: "", isDir: false, time: undefined, missed };
    } else {
      return undefined;
    }
    this.lastSeq_ = event.seq;
    if (!this.onEvent) this.buffer.push(event);
    return event;
  }

  /** The reading task: events into the buffer or the callback until the watch is closed, ends in the sandbox,
   * or fails; a stream that drops is opened again after the last event received. Never rejects. */
  private async follow(): Promise<void> {
    let deadline: number | undefined;
    for (;;) {
      let failure: MentisError;
      try {
        for (;;) {
          const r = await this.stream.it.next();
          if (r.done || this.closed) break;
          const event = this.feed(r.value);
          if (!event) continue;
          deadline = undefined;
          if (this.onEvent) {
            try {
              this.onEvent(event);
            } catch (e) {
              this.end({ error: e }); // the callback's error: the watch's failure
              return;
            }
          }
          this.changes.notify();
        }
        this.end(); // closed, or the runtime ended the stream: the watch ended
        return;
      } catch (e) {
        this.stream.call.abort();
        if (this.closed) {
          this.end();
          return;
        }
        failure = streamError(e);
        if (!resumable(failure)) {
          this.end({ error: failure });
          return;
        }
      }
      // Open it again, after the last event received, within the deadline.
      for (;;) {
        const now = Date.now();
        deadline ??= now + RESUME_FOR_MS;
        if (this.closed) {
          this.end();
          return;
        }
        if (now > deadline) {
          this.end({ error: failure });
          return;
        }
        await this.changes.next(RETRY_PAUSE_MS);
        if (this.closed) continue;
        const request = { sandboxId: this.sandboxId, watchId: this.watchId, afterSeq: BigInt(this.lastSeq_) };
        try {
          this.stream = await openStream(this.conn, request);
        } catch (e) {
          failure = e instanceof MentisError ? e : streamError(e);
          if (!resumable(failure)) {
            this.end({ error: failure });
            return;
          }
          continue;
        }
        if (this.closed) this.stream.call.abort(); // closed while it opened again
        deadline = undefined;
        break;
      }
    }
  }

  private end(failure?: { error: unknown }): void {
    this.stream.call.abort();
    if (!this.done) {
      this.failure = failure;
      this.done = true;
    }
    this.changes.notify();
  }

  // --- waiting

  private checkReadable(): void {
    if (this.onEvent) throw new MentisError("this watch's events go to its onEvent callback; there is nothing to read");
  }

  // --- its events

  /**
   * The events that arrived since the last read, waiting up to `timeoutMs` (default: no limit) for one. [] when
   * the time passed with none, or once the watch is closed (or ended) and all was read; the error that ended it
   * (a stream that could not be opened again) is thrown then. `signal` aborts the wait.
   */
  async read(options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<FileEvent[]> {
    this.checkReadable();
    await this.changes.until(() => this.buffer.length > 0 || this.done, options.timeoutMs, options.signal);
    if (this.buffer.length) {
      const events = this.buffer;
      this.buffer = [];
      return events;
    }
    if (this.failure) throw this.failure.error;
    return [];
  }

  /** The events one by one as they come, until the watch is closed or ends in the sandbox. Leaving the loop
   * early loses nothing (the watch stays open): the next loop goes on from there. */
  async *[Symbol.asyncIterator](): AsyncGenerator<FileEvent> {
    for (;;) {
      this.checkReadable();
      await this.changes.until(() => this.buffer.length > 0 || this.done, undefined, undefined);
      const event = this.buffer.shift();
      if (event === undefined) {
        if (this.failure) throw this.failure.error;
        return;
      }
      yield event;
    }
  }

  /**
   * Resolves when the reading ends: `close()` (also from `onEvent`), or the watch ending in the sandbox (its
   * executor stopped). Rejects with the error that ended it: `onEvent`'s, or a stream that could not be opened
   * again; with a `TimeoutError` when it still runs after `timeoutMs`.
   */
  async wait(options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<void> {
    if (!(await this.changes.until(() => this.done, options.timeoutMs, options.signal))) {
      throw new DOMException(`watch ${this.watchId} still runs after ${options.timeoutMs} ms`, "TimeoutError");
    }
    if (this.failure) throw this.failure.error;
  }

  // --- the end

  /** Ends this reader: its stream is cancelled and its reading task awaited. Events not yet read stay readable.
   * The watch stays in the sandbox for 5 minutes, for `attachWatch`. Closing twice is no error. */
  async close(): Promise<void> {
    this.closed = true;
    this.stream.call.abort();
    this.changes.notify();
    await this.reading;
  }

  /** `await using`: `close()`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
