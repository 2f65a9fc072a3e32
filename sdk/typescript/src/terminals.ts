/**
 * Interactive terminals in a sandbox (`sandbox.terminals`): a program on a real pseudo-terminal, a login bash
 * by default (docs/TERMINALS.md).
 *
 *     await using term = await sb.terminals.open({ rows: 24, cols: 80 });
 *     await term.write("echo hi\n");
 *     await term.readUntil("hi");
 *     await term.resize(40, 120);
 *     await term.write("exit 3\n");
 *     console.log(await term.wait()); // 3
 *
 * A terminal lives in the sandbox, not in the stream: `detach()` leaves it running and
 * `sb.terminals.attach(id)` comes back to it (its scrollback replayed); `close()` (and the end of an
 * `await using` block, unless it was detached) hangs it up. A stream that drops is attached again after the
 * last output received, so each byte arrives once.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import {
  type OpenRequest,
  OpenRequestSchema,
  type OpenResponse,
  type OpenResponse_Output,
  type OpenResponse_Started,
  type TerminalInfo as TerminalInfoMessage,
} from "./gen/mentis/v1/terminal_pb.js";
import { Changes } from "./changes.js";
import type { Connection } from "./client.js";
import type { Sandbox } from "./sandbox.js";
import { DeadlineExceeded, FailedPrecondition, InvalidArgument, MentisError, NotFound } from "./errors.js";
import { streamError } from "./streams.js";
import { RESUME_FOR_MS, RETRY_PAUSE_MS, resumable as actionResumable, wholeSeconds } from "./actions.js";
import { str, strings } from "./args.js";

// Bytes of input per message.
const INPUT_CHUNK = 64 * 1024;
// The largest width or height a terminal takes (the runtime's bound).
const MAX_SIZE = 1000;
// Signals a terminal takes, as `kill -l` names them without SIG.
const SIGNALS = ["INT", "TERM", "KILL", "HUP", "QUIT", "TSTP", "CONT", "USR1", "USR2", "WINCH"] as const;
// How long `close` waits for the program to end after the hang-up (SIGHUP, then SIGKILL a second later).
const CLOSE_WAIT_MS = 10_000;

/** A signal a terminal's foreground process group takes, with or without `SIG`. */
export type TerminalSignal = (typeof SIGNALS)[number] | `SIG${(typeof SIGNALS)[number]}`;

/** A terminal of the sandbox, as `terminals.list()` reports it. */
export interface TerminalInfo {
  id: string;
  /** The program and its arguments. */
  command: string[];
  cols: number;
  rows: number;
  /** The program's process id in the sandbox. */
  pid: number;
  createdAt: Date | undefined;
  /** The seq of its newest output. */
  lastSeq: bigint;
  /** Streams attached now. */
  attached: number;
  /** Its exit code once the program ended; undefined while it runs. */
  exitCode: number | undefined;
}

/** A link to the runtime's web terminal (docs/TERMINALS.md, "Web terminal"). */
export interface TerminalLink {
  /** The whole link, to open in a browser. */
  url: string;
  /** `/terminal#token=...`: put the runtime's HTTP address in front. */
  path: string;
  /** The signed token alone. */
  token: string;
  /** The link opens, and its page stays open, until then. */
  expiresAt: Date | undefined;
}

/** Options of `terminals.open`. */
export interface TerminalOpenOptions {
  /** The program and its arguments (argv, no shell); default: a login bash. */
  command?: string[];
  /** Rows, at most 1000 (default 24; 0: the runtime's, 24). */
  rows?: number;
  /** Columns, at most 1000 (default 80; 0: the runtime's, 80). */
  cols?: number;
  /** Environment over the sandbox's (TERM is xterm-256color unless set). */
  env?: Record<string, string>;
  /** The working directory (default /workspace; a relative path is taken from there). */
  cwd?: string;
  /** How long the terminal outlives its last client, rounded up to whole seconds (default: the runtime's,
   * 15 minutes). */
  idleTimeoutMs?: number;
  /** Called with the output as it arrives; `read` and the iterator then have none. */
  onOutput?: (data: Uint8Array) => void;
}

/** Options of `terminals.attach`. */
export interface TerminalAttachOptions {
  /** Replay the scrollback after this seq (default 0: all that is kept). */
  afterSeq?: bigint | number;
  /** Called with the output as it arrives; `read` and the iterator then have none. */
  onOutput?: (data: Uint8Array) => void;
}

/** Options of a call that waits: `timeoutMs` (default: no limit, unless said) and an AbortSignal. */
export interface WaitOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** `readUntil` found the terminal's end before its marker: the program exited, or this client detached. */
export class TerminalEnded extends FailedPrecondition {}

const encoder = new TextEncoder();

function asBytes(data: Uint8Array | string, field: string): Uint8Array {
  if (typeof data === "string") return encoder.encode(data);
  if (data instanceof Uint8Array) return data;
  throw new InvalidArgument(`${field} must be a string or a Uint8Array, not ${typeof data}`, { field });
}

function checkSize(rows: unknown, cols: unknown, low: number): void {
  for (const [field, n] of [
    ["rows", rows],
    ["cols", cols],
  ] as const) {
    if (typeof n !== "number" || !Number.isInteger(n) || n < low || n > MAX_SIZE) {
      throw new InvalidArgument(`${field} is ${String(n)}; it must be a whole number from ${low} to ${MAX_SIZE}`, {
        field,
      });
    }
  }
}

function signalName(name: string): string {
  const bare = typeof name === "string" ? name.toUpperCase().replace(/^SIG/, "") : "";
  if (!(SIGNALS as readonly string[]).includes(bare)) {
    throw new InvalidArgument(`unknown signal ${JSON.stringify(name)}; one of ${SIGNALS.join(", ")}`, {
      field: "signal",
    });
  }
  return bare;
}

function startRequest(sandboxId: string, options: TerminalOpenOptions): OpenRequest {
  const command: unknown = options.command ?? [];
  if (!Array.isArray(command) || !command.every((a) => typeof a === "string")) {
    throw new InvalidArgument("command is an array of arguments (argv, no shell), not a string", {
      field: "command",
    });
  }
  const rows = options.rows ?? 24;
  const cols = options.cols ?? 80;
  checkSize(rows, cols, 0);
  return create(OpenRequestSchema, {
    kind: {
      case: "start",
      value: {
        sandboxId,
        command: command as string[],
        rows,
        cols,
        env: strings(options.env, "env"),
        workDir: str(options.cwd, "cwd"),
        idleTimeoutSeconds: wholeSeconds(options.idleTimeoutMs, "idleTimeoutMs"),
      },
    },
  });
}

function attachRequest(sandboxId: string, terminalId: string, afterSeq: bigint | number): OpenRequest {
  if (typeof terminalId !== "string" || !terminalId) {
    throw new InvalidArgument("terminalId must name a terminal", { field: "terminalId" });
  }
  let seq: bigint;
  try {
    seq = BigInt(afterSeq);
  } catch {
    seq = -1n;
  }
  if (seq < 0n) {
    throw new InvalidArgument(`afterSeq must be a whole number, 0 or more, not ${String(afterSeq)}`, {
      field: "afterSeq",
    });
  }
  return create(OpenRequestSchema, { kind: { case: "attach", value: { sandboxId, terminalId, afterSeq: seq } } });
}

function resizeRequest(rows: number, cols: number): OpenRequest {
  return create(OpenRequestSchema, { kind: { case: "resize", value: { rows, cols } } });
}

function terminalInfo(t: TerminalInfoMessage): TerminalInfo {
  return {
    id: t.terminalId,
    command: [...t.command],
    cols: t.cols,
    rows: t.rows,
    pid: t.pid,
    createdAt: t.createdAt ? timestampDate(t.createdAt) : undefined,
    lastSeq: t.lastSeq,
    attached: t.attached,
    exitCode: t.exitCode,
  };
}

function checkWait(options: WaitOptions): void {
  const t = options.timeoutMs;
  if (t !== undefined && (typeof t !== "number" || Number.isNaN(t) || t < 0)) {
    throw new InvalidArgument(`timeoutMs must be 0 or more milliseconds, not ${String(t)}`, { field: "timeoutMs" });
  }
}


function show(data: Uint8Array): string {
  return JSON.stringify(new TextDecoder().decode(data));
}

/** An error the onOutput callback threw: it ends the terminal's following, and `wait` rejects with it. */
class CallbackError extends Error {}

/** One Open stream of the terminal: it takes queued input once it is live, and none once it is closed. */
interface Stream {
  readonly call: AbortController;
  responses: AsyncIterator<OpenResponse> | undefined;
  live: boolean;
  closed: boolean;
}

/** A request waiting for the stream, and whoever waits for it to be sent. */
interface Queued {
  request: OpenRequest;
  sent: () => void;
  failed: (e: unknown) => void;
}

/**
 * An interactive terminal in a sandbox: a program on a real pseudo-terminal. Made by `sb.terminals.open()` or
 * `sb.terminals.attach(id)`.
 *
 * Input: `write` (text or bytes; "\r" or "\n" is Enter, "\x03" is Ctrl-C), `resize`, `sendSignal`. Output, as
 * the program wrote it (escape sequences included): `read`, `readUntil`, `for await` (chunks until the program
 * ends), or the `onOutput` callback. `wait()` gives the exit code. `await using` closes it at the block's end,
 * unless it was detached.
 */
export class Terminal {
  private buffer: Buffer = Buffer.alloc(0);
  private lastSeq_ = 0n;
  private exitCode_: number | undefined;
  private signal_ = 0;
  private failure: unknown;
  private detached = false;
  private done = false;
  private stream: Stream | undefined;
  private readonly queue: Queued[] = [];
  // Resolvers of everyone waiting for a change: output, the end, a stream that became live or closed.
  private readonly changes = new Changes();
  private task: Promise<void> = Promise.resolve();
  private rows_ = 0;
  private cols_ = 0;
  /** The terminal's id: `sb.terminals.attach(id)` comes back to it. */
  id = "";

  /** @internal Use `sb.terminals.open()` or `sb.terminals.attach()`. */
  constructor(
    private readonly conn: Connection,
    private readonly sandboxId: string,
    private readonly onOutput: ((data: Uint8Array) => void) | undefined,
  ) {}

  /** @internal Opens the first stream and starts following it. */
  async start(first: OpenRequest): Promise<this> {
    const started = await this.openStream(first);
    this.id = started.terminalId;
    this.rows_ = started.rows;
    this.cols_ = started.cols;
    this.task = this.readStream();
    return this;
  }

  /** @internal Resolves once this client stopped following the terminal (its end, a detach, a failure). */
  get finished(): Promise<void> {
    return this.task;
  }

  get rows(): number {
    return this.rows_;
  }

  get cols(): number {
    return this.cols_;
  }

  /** The program's exit code (128 + N when signal N killed it); undefined while it runs. */
  get exitCode(): number | undefined {
    return this.exitCode_;
  }

  /** The signal that killed the program; 0 when it exited (or runs). */
  get signal(): number {
    return this.signal_;
  }

  /** The seq of the newest output received (`attach(id, { afterSeq })` replays what follows it). */
  get lastSeq(): bigint {
    return this.lastSeq_;
  }

  toString(): string {
    return `Terminal(${this.id}, exitCode=${this.exitCode_ ?? "running"})`;
  }

  // --- the stream

  /** The requests of `stream`: `first`, then the queued ones while it is live; done once it is closed. */
  private requests(first: OpenRequest, stream: Stream): AsyncIterable<OpenRequest> {
    let sentFirst = false;
    let finished = false;
    const next = async (): Promise<IteratorResult<OpenRequest>> => {
      if (!sentFirst) {
        sentFirst = true;
        return { done: false, value: first };
      }
      for (;;) {
        if (finished || stream.closed || this.done) return { done: true, value: undefined };
        const queued = stream.live ? this.queue.shift() : undefined;
        if (queued) {
          queued.sent();
          return { done: false, value: queued.request };
        }
        await this.changes.next();
      }
    };
    return {
      [Symbol.asyncIterator]: () => ({
        next,
        // The transport could not send (the stream is gone): the reading side sees why.
        throw: async () => {
          finished = true;
          return { done: true, value: undefined };
        },
        return: async () => {
          finished = true;
          return { done: true, value: undefined };
        },
      }),
    };
  }

  /** Opens a stream with `first` (start or attach) and returns its `started`; typed errors. */
  private async openStream(first: OpenRequest): Promise<OpenResponse_Started> {
    const stream: Stream = { call: new AbortController(), responses: undefined, live: false, closed: false };
    // Current from now: a detach while it opens ends it. It takes queued input once it is live.
    this.stream = stream;
    try {
      const responses = this.conn.terminals.open(this.requests(first, stream), { signal: stream.call.signal });
      stream.responses = responses[Symbol.asyncIterator]();
      for (;;) {
        const r = await stream.responses.next();
        if (r.done) throw new MentisError("the terminal's stream ended before it started");
        if (r.value.kind.case === "started") {
          stream.live = true;
          this.changes.notify();
          return r.value.kind.value;
        }
      }
    } catch (e) {
      this.closeStream(stream);
      throw streamError(e);
    }
  }

  private closeStream(stream: Stream | undefined): void {
    if (!stream || stream.closed) return;
    stream.closed = true;
    stream.call.abort();
    this.changes.notify();
  }

  /** Follows the terminal until its end, a detach or a failure; a stream that drops is attached again after
   * the last output received. */
  private async readStream(): Promise<void> {
    let deadline: number | undefined;
    try {
      for (;;) {
        const stream = this.stream;
        let failure: unknown;
        try {
          if (await this.follow(stream)) return;
          failure = new MentisError(`terminal ${this.id}'s stream ended before its program`, { code: "UNAVAILABLE" });
        } catch (e) {
          this.closeStream(stream);
          if (this.detached) return this.end();
          if (e instanceof CallbackError) return this.end({ failure: e.cause });
          const err = streamError(e);
          if (!resumable(err)) return this.end({ failure: err });
          failure = err;
        }
        this.closeStream(stream);
        // Attach again, after the last output received, within the deadline.
        for (;;) {
          const now = Date.now();
          deadline ??= now + RESUME_FOR_MS;
          if (this.detached) return this.end();
          if (now > deadline) return this.end({ failure });
          await sleep(RETRY_PAUSE_MS);
          if (this.detached) return this.end();
          let started: OpenResponse_Started;
          try {
            started = await this.openStream(attachRequest(this.sandboxId, this.id, this.lastSeq_));
          } catch (e) {
            const err = streamError(e);
            if (!resumable(err)) return this.end({ failure: err });
            failure = err;
            continue;
          }
          if (this.detached) {
            this.closeStream(this.stream);
            return this.end();
          }
          if (started.rows !== this.rows_ || started.cols !== this.cols_) {
            this.queue.unshift({ request: resizeRequest(this.rows_, this.cols_), sent: () => {}, failed: () => {} });
            this.changes.notify();
          }
          deadline = undefined;
          break;
        }
      }
    } catch (e) {
      // Nothing above should throw; if it did, it is the terminal's failure rather than an unhandled rejection.
      this.end({ failure: e });
    }
  }

  /** Follows one stream; true once the terminal's end (or this client's) is recorded. */
  private async follow(stream: Stream | undefined): Promise<boolean> {
    const responses = stream?.responses;
    if (!responses) throw new MentisError("the terminal has no stream");
    for (;;) {
      const r = await responses.next();
      if (r.done) break;
      const kind = r.value.kind;
      if (kind.case === "output") {
        const data = this.feed(kind.value);
        if (data && this.onOutput) {
          try {
            this.onOutput(data);
          } catch (e) {
            throw new CallbackError("the onOutput callback threw", { cause: e });
          }
        }
      } else if (kind.case === "exited") {
        this.end({ exitCode: kind.value.exitCode, signal: kind.value.signal });
        return true;
      }
    }
    if (this.detached) {
      this.end();
      return true;
    }
    // Ended without `exited`: the program may have ended all the same, or a proxy cut the stream.
    const known = await this.exitFromList();
    if (known !== undefined) {
      this.end({ exitCode: known });
      return true;
    }
    return false;
  }

  /** The bytes of `output` new to this client (a replay after a reattach repeats some), kept for `read`. */
  private feed(output: OpenResponse_Output): Uint8Array | undefined {
    if (output.seq <= this.lastSeq_) return undefined;
    this.lastSeq_ = output.seq;
    if (!this.onOutput) {
      this.buffer = this.buffer.length ? Buffer.concat([this.buffer, output.data]) : Buffer.from(output.data);
    }
    this.changes.notify();
    return output.data;
  }

  /** The exit code ListTerminals reports for this terminal (undefined while it runs). */
  private async exitFromList(): Promise<number | undefined> {
    let listed: TerminalInfoMessage[];
    try {
      listed = (await this.conn.terminals.listTerminals({ sandboxId: this.sandboxId })).terminals;
    } catch (e) {
      const err = streamError(e);
      if (resumable(err)) return undefined;
      throw err;
    }
    const t = listed.find((t) => t.terminalId === this.id);
    if (!t) throw new NotFound(`terminal ${this.id} is gone`, { reason: "TERMINAL_NOT_FOUND" });
    return t.exitCode;
  }

  private end(how: { exitCode?: number; signal?: number; failure?: unknown } = {}): void {
    if (how.exitCode !== undefined) {
      this.exitCode_ = how.exitCode;
      this.signal_ = how.signal ?? 0;
    }
    this.failure = how.failure;
    this.done = true;
    this.closeStream(this.stream);
    for (const q of this.queue.splice(0)) q.failed(this.notOpen());
    this.changes.notify();
  }

  private notOpen(): unknown {
    if (this.failure !== undefined) return this.failure;
    if (this.exitCode_ !== undefined) {
      return new FailedPrecondition(`terminal ${this.id} has exited (exit code ${this.exitCode_})`);
    }
    return new FailedPrecondition(`terminal ${this.id} is no longer attached`);
  }

  private async send(requests: OpenRequest[]): Promise<void> {
    if (this.done) throw this.notOpen();
    const sent = requests.map(
      (request) => new Promise<void>((sent, failed) => this.queue.push({ request, sent, failed })),
    );
    this.changes.notify();
    await Promise.all(sent);
  }

  // --- input

  /** Types `data` into the terminal (text is sent as UTF-8); resolves once it is on the stream.
   * FailedPrecondition once the terminal ended or was detached. */
  async write(data: Uint8Array | string): Promise<void> {
    const bytes = asBytes(data, "data");
    const requests: OpenRequest[] = [];
    for (let at = 0; at < bytes.length; at += INPUT_CHUNK) {
      requests.push(create(OpenRequestSchema, { kind: { case: "input", value: { data: bytes.subarray(at, at + INPUT_CHUNK) } } }));
    }
    await this.send(requests);
  }

  /** Gives the terminal a new size (1 to 1000 each); the program gets SIGWINCH. */
  async resize(rows: number, cols: number): Promise<void> {
    checkSize(rows, cols, 1);
    await this.send([resizeRequest(rows, cols)]);
    this.rows_ = rows;
    this.cols_ = cols;
  }

  /** Sends a signal to the terminal's foreground process group: `"INT"`, `"TERM"`, `"KILL"`, `"HUP"`, `"QUIT"`,
   * `"TSTP"`, `"CONT"`, `"USR1"`, `"USR2"` or `"WINCH"` (with or without SIG). */
  async sendSignal(name: TerminalSignal | (string & {})): Promise<void> {
    const bare = signalName(name);
    await this.send([create(OpenRequestSchema, { kind: { case: "signal", value: { name: bare } } })]);
  }

  // --- output

  private checkReadable(): void {
    if (this.onOutput) {
      throw new FailedPrecondition("this terminal's output goes to its onOutput callback; there is nothing to read");
    }
  }

  private take(end: number): Uint8Array {
    const data = new Uint8Array(this.buffer.subarray(0, end));
    this.buffer = this.buffer.subarray(end);
    return data;
  }

  /** The output that arrived since the last read, waiting (up to `timeoutMs`; default no limit) for some. Empty
   * when the time passed with none, or once the terminal ended and everything was read. */
  async read(options: WaitOptions = {}): Promise<Uint8Array> {
    this.checkReadable();
    checkWait(options);
    await this.changes.until(() => this.buffer.length > 0 || this.done, options.timeoutMs, options.signal);
    if (this.buffer.length) return this.take(this.buffer.length);
    if (this.done && this.failure !== undefined) throw this.failure;
    return new Uint8Array();
  }

  /** Reads until `marker` appears and returns the output up to and including it (what follows stays to be
   * read). DeadlineExceeded when it did not appear within `timeoutMs` (default 30 s), TerminalEnded when the
   * terminal ended first. */
  async readUntil(marker: Uint8Array | string, options: WaitOptions = {}): Promise<Uint8Array> {
    this.checkReadable();
    checkWait(options);
    const want = asBytes(marker, "marker");
    if (!want.length) throw new InvalidArgument("marker is empty", { field: "marker" });
    const timeoutMs = options.timeoutMs ?? 30_000;
    const found = () => this.buffer.indexOf(want);
    if (!(await this.changes.until(() => found() >= 0 || this.done, timeoutMs, options.signal))) {
      const tail = this.buffer.subarray(Math.max(0, this.buffer.length - 200));
      throw new DeadlineExceeded(`${show(want)} did not appear within ${timeoutMs} ms; the last output: ${show(tail)}`);
    }
    const at = found();
    if (at >= 0) return this.take(at + want.length);
    if (this.failure !== undefined) throw this.failure;
    const how = this.exitCode_ !== undefined ? `exited (exit code ${this.exitCode_})` : "is no longer attached";
    throw new TerminalEnded(`terminal ${this.id} ${how} before ${show(want)} appeared`);
  }

  /** The output in chunks as it arrives, until the program ends. */
  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    for (;;) {
      const data = await this.read();
      if (!data.length) return;
      yield data;
    }
  }

  // --- the end

  /** Waits for the program's end and returns its exit code (128 + N when signal N killed it).
   * DeadlineExceeded when it runs on after `timeoutMs` (default: no limit); FailedPrecondition when this client
   * detached first. */
  async wait(options: WaitOptions = {}): Promise<number> {
    checkWait(options);
    if (!(await this.changes.until(() => this.done, options.timeoutMs, options.signal))) {
      throw new DeadlineExceeded(`terminal ${this.id} still runs after ${options.timeoutMs} ms`);
    }
    if (this.exitCode_ !== undefined) return this.exitCode_;
    if (this.failure !== undefined) throw this.failure;
    throw new FailedPrecondition(`terminal ${this.id} was detached before its program ended`);
  }

  /** Ends this client's stream and leaves the terminal running in the sandbox (until its idle timeout):
   * `sb.terminals.attach(terminal.id)` comes back to it. */
  async detach(): Promise<void> {
    if (!this.done) {
      this.detached = true;
      this.closeStream(this.stream);
    }
    await this.task;
  }

  /** Hangs the terminal up (its session gets SIGHUP, then SIGKILL a second later), waits for the program's end
   * and has the sandbox forget it. Closing twice, or a terminal that ended, is no error. */
  async close(): Promise<void> {
    const attached = !this.done;
    await this.hangUp();
    if (attached) {
      await this.changes.until(() => this.done, CLOSE_WAIT_MS);
      if (this.exitCode_ !== undefined) await this.hangUp(); // it ended: this forgets it
    }
    await this.detach();
  }

  private async hangUp(): Promise<void> {
    try {
      await this.conn.terminals.closeTerminal({ sandboxId: this.sandboxId, terminalId: this.id });
    } catch (e) {
      const err = streamError(e);
      if (err.code !== "NOT_FOUND") {
        await this.detach();
        throw err;
      }
    }
  }

  /** `await using`: closes the terminal, unless it was detached (then it runs on). */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.detached) await this.close();
  }
}

// Node's codes for a connection that broke under a call. Connect-ES reports some of them (a reset: ECONNRESET)
// as ABORTED, a code the runtime also answers with; the cause tells them apart.
/** A failure after which a stream is attached again: the connection broke, or the runtime is restarting
 * (actions.ts' rule, on the call's own error beneath the typed one). */
function resumable(err: MentisError): boolean {
  return err.code === "UNAVAILABLE" || err.code === "CANCELLED" || (err.cause !== undefined && actionResumable(err.cause, undefined));
}

/** The sandbox's terminals (sandbox.terminals): `open` one, `attach` to one, `list`, `close`, `link` (the web
 * terminal). */
export class Terminals {
  private readonly following = new Set<Terminal>();

  constructor(private readonly sandbox: Sandbox) {}

  private get conn(): Connection {
    return this.sandbox.connection;
  }

  /** Starts a program (default: a login bash) on a new terminal. FailedPrecondition when it cannot start. */
  async open(options: TerminalOpenOptions = {}): Promise<Terminal> {
    const first = startRequest(this.sandbox.id, options);
    return this.track(await new Terminal(this.conn, this.sandbox.id, options.onOutput).start(first));
  }

  /** A terminal of the sandbox that runs (or ended and is not yet forgotten): its scrollback after `afterSeq`
   * (0: all that is kept) is replayed, then its output followed. NotFound (TERMINAL_NOT_FOUND) when there is
   * none. */
  async attach(terminalId: string, options: TerminalAttachOptions = {}): Promise<Terminal> {
    const first = attachRequest(this.sandbox.id, terminalId, options.afterSeq ?? 0);
    return this.track(await new Terminal(this.conn, this.sandbox.id, options.onOutput).start(first));
  }

  private track(terminal: Terminal): Terminal {
    this.following.add(terminal);
    void terminal.finished.then(() => this.following.delete(terminal));
    return terminal;
  }

  /** @internal Detaches every terminal this object follows (the sandbox's connection closes). */
  async detachAll(): Promise<void> {
    await Promise.all([...this.following].map((t) => t.detach()));
  }

  /** The sandbox's terminals, oldest first: running, or ended and not yet forgotten. */
  async list(): Promise<TerminalInfo[]> {
    const r = await this.conn.call(() => this.conn.terminals.listTerminals({ sandboxId: this.sandbox.id }));
    return r.terminals.map(terminalInfo);
  }

  /** Hangs up a terminal by id (SIGHUP, then SIGKILL); one that already ended is forgotten. NotFound when there
   * is none. */
  async close(terminalId: string): Promise<void> {
    await this.conn.call(() => this.conn.terminals.closeTerminal({ sandboxId: this.sandbox.id, terminalId }));
  }

  /** A link to the runtime's web terminal for this sandbox, attached to `terminalId` (none: the page starts a
   * login bash), that opens (and whose page stays open) for `ttlMs` (default an hour, at most 12 hours).
   * FailedPrecondition when the runtime serves no web page (MENTIS_HTTP_LISTEN unset). */
  async link(terminalId = "", options: { ttlMs?: number } = {}): Promise<TerminalLink> {
    const r = await this.conn.call(() =>
      this.conn.terminals.createTerminalLink({
        sandboxId: this.sandbox.id,
        terminalId,
        ttlSeconds: wholeSeconds(options.ttlMs, "ttlMs"),
      }),
    );
    return { url: r.url, path: r.path, token: r.token, expiresAt: r.expiresAt ? timestampDate(r.expiresAt) : undefined };
  }

  /** Revokes every web terminal link of the sandbox handed out so far (their pages are disconnected; the
   * terminals keep running). */
  async revokeLinks(): Promise<void> {
    await this.conn.call(() => this.conn.terminals.revokeTerminalLinks({ sandboxId: this.sandbox.id }));
  }
}
