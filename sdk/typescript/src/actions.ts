/**
 * Commands and cells: an action's observations, each once, across dropped streams, and what they add up to.
 *
 * A command is sent with Execute and a client-made action id. When the stream breaks (the network, a restart of
 * the runtime), it is resumed with StreamObservations after the last seq this client saw; when it broke before
 * the runtime answered, Execute is sent again with the same action id, which the runtime runs at most once. The
 * caller sees each byte once and the command runs once.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { type Action, ActionSchema } from "./gen/mentis/v1/action_pb.js";
import {
  type CmdEnd,
  EndReason,
  type IPythonResult,
  IpythonOutputKind,
  IpythonStatus,
  type Observation,
  OutputStream,
} from "./gen/mentis/v1/observation_pb.js";
import type { Connection } from "./client.js";
import { fromRejection, InvalidArgument, MentisError } from "./errors.js";
import { brokenConnection, streamError } from "./streams.js";

/** How long a broken stream keeps being resumed before its error is thrown. */
export const RESUME_FOR_MS = 60_000;
/** The pause between two attempts to resume a broken stream. */
export const RETRY_PAUSE_MS = 50;

/** Why a command ended: it exited (with its exit code), or the runtime ended it. */
export type EndReasonName =
  | "exited"
  | "timed_out"
  | "cancelled"
  | "lost"
  | "failed_to_start"
  | "oom_killed"
  | "pids_limit_reached"
  | "unspecified";

/** How a shell command ended, with everything it wrote. */
export class CommandResult {
  constructor(
    /** The command's exit code (128 + N when signal N killed it). */
    readonly exitCode: number,
    /** `"exited"`, or why the runtime ended it (`"timed_out"`, `"cancelled"`, `"oom_killed"`, ...). */
    readonly reason: EndReasonName,
    readonly stdoutBytes: Uint8Array,
    readonly stderrBytes: Uint8Array,
    /** The signal that killed it (0: none). */
    readonly signal: number,
    /** More about the reason when it is not `"exited"`. */
    readonly message: string,
    readonly durationMs: number,
    /** The action id: `Sandbox.attachCommand` follows it again. */
    readonly actionId: string,
  ) {}

  /** stdout as UTF-8 (invalid sequences replaced). */
  get stdout(): string {
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(this.stdoutBytes);
  }

  /** stderr as UTF-8 (invalid sequences replaced). */
  get stderr(): string {
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(this.stderrBytes);
  }

  /** Exited with 0. */
  get ok(): boolean {
    return this.reason === "exited" && this.exitCode === 0;
  }
}

/** One rich output of a cell (display data, or the cell's value): its MIME bundle and the usual parts. */
export interface CellOutput {
  /** Every MIME type the kernel sent; images (except SVG) decoded to bytes. */
  data: Record<string, string | Uint8Array>;
  /** `text/plain`. */
  text?: string;
  /** `text/html`. */
  html?: string;
  /** `text/markdown`. */
  markdown?: string;
  /** `image/png`, decoded. */
  png?: Uint8Array;
  /** `image/jpeg`, decoded. */
  jpeg?: Uint8Array;
  /** `image/svg+xml`. */
  svg?: string;
  /** `application/json`, parsed. */
  json?: unknown;
  /** Whether this is the cell's value (`Out[n]`) rather than something it displayed. */
  isResult: boolean;
}

/** The exception a cell raised. */
export interface CellError {
  name: string;
  value: string;
  traceback: string[];
}

/** How a cell ended. */
export interface CellResult {
  /** `"ok"`, `"error"` (the cell raised: see `error`) or `"aborted"` (see `reason`). */
  status: "ok" | "error" | "aborted" | "unspecified";
  /** What the cell printed, stdout and stderr in order. */
  text: string;
  /** Rich outputs: display data and the cell's value, in order. */
  results: CellOutput[];
  error?: CellError;
  executionCount: number;
  /** Why an aborted cell did not run to its end. */
  reason: string;
  durationMs: number;
  actionId: string;
  ok: boolean;
}

/** Options of a shell command. */
export interface RunOptions {
  /** The command's time limit, rounded up to whole seconds (default: the runtime's). It then ends as
   * `"timed_out"`. */
  timeoutMs?: number;
  env?: Record<string, string>;
  /** The working directory (default: the sandbox's work dir, or the session's). */
  cwd?: string;
  /** A named shell session: its commands run one after another, keeping cwd and variables. */
  session?: string;
  /** Bytes (or text) on the command's stdin. */
  stdin?: Uint8Array | string;
  /** Called with stdout's text as it arrives (a multi-byte character is never split). */
  onStdout?: (text: string) => void;
  /** Called with stderr's text as it arrives. */
  onStderr?: (text: string) => void;
  /** Aborting cancels the command in the sandbox and rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Options of an IPython cell. */
export interface RunCodeOptions {
  /** The cell's time limit, rounded up to whole seconds (default: the runtime's). */
  timeoutMs?: number;
  /** Called with what the cell prints as it prints it. */
  onOutput?: (text: string) => void;
  /** Aborting interrupts the cell and rejects with the signal's reason. */
  signal?: AbortSignal;
}

export function wholeSeconds(ms: number | undefined, field: string): number {
  if (ms === undefined || ms === 0) return 0;
  if (!Number.isFinite(ms) || ms < 0) {
    throw new InvalidArgument(`${field} must be a positive number of milliseconds, not ${ms}`, { field });
  }
  return Math.ceil(ms / 1000);
}

export function shellAction(command: string, options: RunOptions): Action {
  const stdin = options.stdin ?? new Uint8Array();
  return create(ActionSchema, {
    kind: {
      case: "shell",
      value: {
        command,
        workDir: options.cwd ?? "",
        env: options.env ?? {},
        timeoutSeconds: wholeSeconds(options.timeoutMs, "timeoutMs"),
        stdin: typeof stdin === "string" ? new TextEncoder().encode(stdin) : stdin,
        session: options.session ?? "",
      },
    },
  });
}

export function cellAction(code: string, options: RunCodeOptions): Action {
  return create(ActionSchema, {
    kind: { case: "ipython", value: { code, timeoutSeconds: wholeSeconds(options.timeoutMs, "timeoutMs") } },
  });
}

/**
 * A failure a resumed stream gets past: the connection broke (`brokenConnection`: Connect-node's own errors,
 * whatever code it gave them), the HTTP/2 stream was reset, or the runtime said UNAVAILABLE (draining,
 * restarting) or CANCELLED.
 */
export function resumable(e: unknown, signal: AbortSignal | undefined): boolean {
  if (signal?.aborted) return false;
  if (e instanceof MentisError) return e.code === "UNAVAILABLE";
  if (brokenConnection(e)) return true;
  const err = ConnectError.from(e);
  return err.code === Code.Canceled || err.rawMessage.startsWith("http/2 stream closed with error code");
}


function isEnd(obs: Observation): boolean {
  return obs.kind.case === "cmdEnd" || obs.kind.case === "ipythonResult";
}

/**
 * One action's observations, each once, across dropped streams: with `action`, Execute first (and again with
 * the same id while no observation came); without it, one submitted before, from the start of the log. Ends at
 * the action's end. `onOpen` is called at the stream's first message.
 */
export async function* observations(
  conn: Connection,
  sandboxId: string,
  action: Action | undefined,
  actionId: string,
  options: { signal?: AbortSignal; onOpen?: () => void } = {},
): AsyncGenerator<Observation> {
  let lastSeq = 0n;
  let started = action === undefined;
  let deadline: number | undefined;
  let onOpen = options.onOpen;
  // Our own controller per call: leaving the loop early (a callback's error, the caller's break) ends the call.
  for (;;) {
    const call = new AbortController();
    const forward = () => call.abort(options.signal?.reason);
    options.signal?.addEventListener("abort", forward, { once: true });
    let failure: unknown;
    try {
      options.signal?.throwIfAborted();
      const stream = started
        ? conn.actions.streamObservations({ sandboxId, afterSeq: lastSeq, actionId }, { signal: call.signal })
        : conn.actions.execute({ sandboxId, action, actionId }, { signal: call.signal });
      for await (const response of stream) {
        if (onOpen) {
          onOpen();
          onOpen = undefined;
        }
        if (response.kind.case !== "observation") continue;
        const obs = response.kind.value;
        started = true;
        if (obs.seq <= lastSeq) continue;
        lastSeq = obs.seq;
        deadline = undefined;
        yield obs;
        if (isEnd(obs)) return;
      }
      failure = new MentisError("the stream ended before the action did", { code: "UNAVAILABLE" });
    } catch (e) {
      if (options.signal?.aborted) throw options.signal.reason;
      if (!resumable(e, options.signal)) throw streamError(e);
      failure = e;
    } finally {
      options.signal?.removeEventListener("abort", forward);
      call.abort();
    }
    const now = Date.now();
    deadline ??= now + RESUME_FOR_MS;
    if (now > deadline) throw streamError(failure);
    await sleep(RETRY_PAUSE_MS);
  }
}

/**
 * Submits `action` as `actionId` on a Connect stream and returns once the runtime accepted it (a background
 * command), retrying with the same id across dropped streams: the runtime runs it once.
 */
export async function submit(conn: Connection, sandboxId: string, action: Action, actionId: string): Promise<void> {
  let deadline: number | undefined;
  for (;;) {
    const call = new AbortController();
    let failure: unknown;
    try {
      const requests = (async function* () {
        yield { kind: { case: "attach" as const, value: { sandboxId } } };
        yield { kind: { case: "submit" as const, value: { action, actionId } } };
        // The request side stays open until the answer came (the call is aborted then).
        await new Promise((resolve) => call.signal.addEventListener("abort", resolve, { once: true }));
      })();
      for await (const response of conn.actions.connect(requests, { signal: call.signal })) {
        const kind = response.kind;
        if (kind.case === "accepted" && kind.value.actionId === actionId) return;
        if (kind.case === "rejected") {
          const err = fromRejection(kind.value.code, kind.value.message, kind.value.reason);
          if (err.code !== "UNAVAILABLE") throw err;
          failure = err;
          break;
        }
      }
      failure ??= new MentisError("the stream ended before the submit was answered", { code: "UNAVAILABLE" });
    } catch (e) {
      if (e instanceof MentisError) throw e;
      if (!resumable(e, undefined)) throw streamError(e);
      failure = e;
    } finally {
      call.abort();
    }
    const now = Date.now();
    deadline ??= now + RESUME_FOR_MS;
    if (now > deadline) throw streamError(failure);
    await sleep(RETRY_PAUSE_MS);
  }
}

function endReasonName(reason: EndReason): EndReasonName {
  return (EndReason[reason] ?? "UNSPECIFIED").toLowerCase() as EndReasonName;
}

function durationMs(d: { seconds: bigint; nanos: number } | undefined): number {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : 0;
}


/** A shell action's observations, as they come, into its result (and the output callbacks). */
export class CommandCollector {
  private readonly out: Uint8Array[] = [];
  private readonly err: Uint8Array[] = [];
  private readonly outText = new TextDecoder("utf-8", { ignoreBOM: true });
  private readonly errText = new TextDecoder("utf-8", { ignoreBOM: true });
  private end: CmdEnd | undefined;

  constructor(
    private readonly onStdout?: (text: string) => void,
    private readonly onStderr?: (text: string) => void,
  ) {}

  feed(obs: Observation): void {
    if (obs.kind.case === "cmdOutput") {
      const { stream, data } = obs.kind.value;
      if (stream === OutputStream.STDERR) {
        this.err.push(data);
        if (this.onStderr) this.emit(this.onStderr, this.errText.decode(data, { stream: true }));
      } else {
        this.out.push(data);
        if (this.onStdout) this.emit(this.onStdout, this.outText.decode(data, { stream: true }));
      }
    } else if (obs.kind.case === "cmdEnd") {
      this.end = obs.kind.value;
    }
  }

  private emit(callback: (text: string) => void, text: string): void {
    if (text) callback(text);
  }

  get ended(): boolean {
    return this.end !== undefined;
  }

  result(actionId: string): CommandResult {
    if (this.onStdout) this.emit(this.onStdout, this.outText.decode());
    if (this.onStderr) this.emit(this.onStderr, this.errText.decode());
    const end = this.end;
    if (!end) throw new MentisError("the action's stream ended without its end");
    return new CommandResult(
      end.exitCode,
      endReasonName(end.reason),
      Buffer.concat(this.out),
      Buffer.concat(this.err),
      end.signal,
      end.message,
      durationMs(end.duration),
      actionId,
    );
  }
}

function cellOutput(data: Record<string, string>, isResult: boolean): CellOutput {
  const bundle: Record<string, string | Uint8Array> = {};
  for (const [mime, value] of Object.entries(data)) {
    bundle[mime] = mime.startsWith("image/") && mime !== "image/svg+xml" ? Buffer.from(value, "base64") : value;
  }
  const out: CellOutput = { data: bundle, isResult };
  if (data["text/plain"] !== undefined) out.text = data["text/plain"];
  if (data["text/html"] !== undefined) out.html = data["text/html"];
  if (data["text/markdown"] !== undefined) out.markdown = data["text/markdown"];
  if (data["image/svg+xml"] !== undefined) out.svg = data["image/svg+xml"];
  const png = bundle["image/png"];
  if (png instanceof Uint8Array) out.png = png;
  const jpeg = bundle["image/jpeg"];
  if (jpeg instanceof Uint8Array) out.jpeg = jpeg;
  if (data["application/json"] !== undefined) {
    try {
      out.json = JSON.parse(data["application/json"]);
    } catch {
      out.json = data["application/json"];
    }
  }
  return out;
}

/** A cell's observations, as they come, into its result (and the output callback). */
export class CellCollector {
  private readonly text: string[] = [];
  private readonly results: CellOutput[] = [];
  private end: IPythonResult | undefined;

  constructor(private readonly onOutput?: (text: string) => void) {}

  feed(obs: Observation): void {
    if (obs.kind.case === "ipythonOutput") {
      const o = obs.kind.value;
      if (o.kind === IpythonOutputKind.STREAM_STDOUT || o.kind === IpythonOutputKind.STREAM_STDERR) {
        this.text.push(o.text);
        this.onOutput?.(o.text);
      } else {
        this.results.push(cellOutput(o.data, o.kind === IpythonOutputKind.EXECUTE_RESULT));
      }
    } else if (obs.kind.case === "ipythonResult") {
      this.end = obs.kind.value;
    }
  }

  result(actionId: string): CellResult {
    const end = this.end;
    if (!end) throw new MentisError("the cell's stream ended without its end");
    const status = (IpythonStatus[end.status] ?? "UNSPECIFIED").toLowerCase() as CellResult["status"];
    const result: CellResult = {
      status,
      text: this.text.join(""),
      results: this.results,
      executionCount: end.executionCount,
      reason: end.reason,
      durationMs: durationMs(end.duration),
      actionId,
      ok: status === "ok",
    };
    if (status === "error") {
      result.error = { name: end.errorName, value: end.errorValue, traceback: [...end.traceback] };
    }
    return result;
  }
}
