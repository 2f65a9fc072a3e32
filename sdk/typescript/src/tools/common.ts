/**
 * What the framework tools share, with no framework imported: their names and descriptions, the calls they
 * make on a sandbox and the text each call gives the model. The rules are the Python SDK's
 * (sdk/python/src/mentis/integrations/_common.py), character for character.
 */
import type { CellOutput, CellResult, CommandResult } from "../actions.js";
import { MentisError } from "../errors.js";
import type { FileInfo } from "../files.js";
import { Sandbox } from "../sandbox.js";

/** The most characters of a tool's text given to the model (head and tail kept, the middle cut). */
export const DEFAULT_LIMIT = 20_000;

/** A tool's name and what the model is told it does. */
export interface ToolSpec {
  readonly name: ToolName;
  readonly description: string;
}

/** The names of the sandbox's tools. */
export type ToolName = "run_shell" | "run_python" | "read_file" | "write_file" | "list_files";

/** `run_shell`: a bash command. */
export const RUN_SHELL: ToolSpec = {
  name: "run_shell",
  description:
    "Run a bash command in the sandbox, a Linux machine of your own, and get its exit code, stdout and " +
    "stderr. It starts in the workspace folder, where files stay between calls. A command that fails is " +
    "no error: read its exit code.",
};

/** `run_python`: a cell of the sandbox's IPython kernel. */
export const RUN_PYTHON: ToolSpec = {
  name: "run_python",
  description:
    "Run Python code as a cell of the sandbox's IPython kernel: variables and imports stay from one call to " +
    "the next. Returns what the code printed, the value of its last expression (images are named by type), " +
    "and the exception with its traceback if it raised one.",
};

/** `read_file`: a text file's content. */
export const READ_FILE: ToolSpec = {
  name: "read_file",
  description: "Read a text file of the sandbox (a relative path is from the workspace folder).",
};

/** `write_file`: text written to a file. */
export const WRITE_FILE: ToolSpec = {
  name: "write_file",
  description:
    "Write text to a file of the sandbox, replacing what it held; missing parent folders are made (a " +
    "relative path is from the workspace folder).",
};

/** `list_files`: a folder's entries. */
export const LIST_FILES: ToolSpec = {
  name: "list_files",
  description:
    "List a folder of the sandbox (the workspace folder when no path is given): one entry a line, folders " +
    "ending with '/', files with their size.",
};

/** The descriptions of the tools' arguments, for the frameworks' argument schemas. */
export const ARGUMENTS = {
  command: "The bash command line to run.",
  timeout: "Seconds the command may run before it is stopped (omitted: the runtime's default).",
  code: "The Python code to run.",
  path: "The file's path.",
  folder: "The folder's path (empty: the workspace folder).",
  content: "The text to write.",
} as const;

// --- the calls

/** What every call takes besides its arguments. */
export interface CallOptions {
  /** The most characters of the answer (0: no limit). */
  limit: number;
  /** Aborting cancels the command or interrupts the cell in the sandbox. */
  signal?: AbortSignal | undefined;
}

/** `run_shell`'s arguments (`timeout` in seconds; none, null or 0: the runtime's default). */
export interface RunShellArgs {
  command: string;
  timeout?: number | null | undefined;
}

/** `run_python`'s arguments. */
export interface RunPythonArgs {
  code: string;
}

/** `read_file`'s arguments. */
export interface ReadFileArgs {
  path: string;
}

/** `write_file`'s arguments. */
export interface WriteFileArgs {
  path: string;
  content: string;
}

/** `list_files`'s arguments (no path, or "": the workspace folder). */
export interface ListFilesArgs {
  path?: string | null | undefined;
}

/** Runs a bash command; its end as text. */
export async function runShell(sb: Sandbox, args: RunShellArgs, options: CallOptions): Promise<string> {
  const timeoutMs = args.timeout ? args.timeout * 1000 : undefined;
  return commandText(await sb.run(args.command, { timeoutMs, signal: options.signal }), options.limit);
}

/** Runs an IPython cell; its end as text. */
export async function runPython(sb: Sandbox, args: RunPythonArgs, options: CallOptions): Promise<string> {
  return cellText(await sb.runCode(args.code, { signal: options.signal }), options.limit);
}

/** Reads a file; its text. */
export async function readFile(sb: Sandbox, args: ReadFileArgs, options: CallOptions): Promise<string> {
  return fileText(args.path, await sb.files.read(args.path), options.limit);
}

/** Writes a file; what was written. */
export async function writeFile(sb: Sandbox, args: WriteFileArgs, _options: CallOptions): Promise<string> {
  await sb.files.write(args.path, args.content);
  return writtenText(args.path, args.content);
}

/** Lists a folder; its entries, one a line. */
export async function listFiles(sb: Sandbox, args: ListFilesArgs, options: CallOptions): Promise<string> {
  const path = args.path ?? "";
  return listingText(path, await sb.files.list(path), options.limit);
}

// --- the text the model gets

// Terminal colours and cursor moves (IPython colours its tracebacks).
const ANSI = /\x1b\[[0-?]*[ -/]*[@-~]/g;
const SURROGATE = /[\uD800-\uDFFF]/;

/** `n` with a comma between groups of three digits, as Python's `f"{n:,}"` writes it. */
function grouped(n: number): string {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

/** The number of characters of `text` as Python counts them: code points, not UTF-16 code units. */
function codePoints(text: string): number {
  if (!SURROGATE.test(text)) return text.length;
  let n = 0;
  for (const _ of text) n++;
  return n;
}

/** The UTF-16 index where `text`'s code point number `n` starts. */
function indexOfCodePoint(text: string, n: number): number {
  let index = 0;
  for (let i = 0; i < n && index < text.length; i++) {
    const c = text.charCodeAt(index);
    const next = text.charCodeAt(index + 1);
    index += c >= 0xd800 && c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff ? 2 : 1;
  }
  return index;
}

/**
 * `text` when it has at most `limit` characters (or `limit` is 0 or less), else its head and tail with a note
 * of what was cut. Characters are counted as Python counts them (code points), so that a text is cut at the
 * same place, with the same note, as the Python SDK's tools cut it.
 */
export function clip(text: string, limit: number): string {
  if (limit <= 0 || text.length <= limit) return text;
  const length = codePoints(text);
  if (length <= limit) return text;
  const head = Math.floor(limit / 2);
  const tail = limit - head;
  const cut = length - limit;
  const note =
    `\n[... ${grouped(cut)} characters cut from the middle: the output had ${grouped(length)} characters, ` +
    `${grouped(limit)} are shown ...]\n`;
  const headEnd = length === text.length ? head : indexOfCodePoint(text, head);
  const tailStart = length === text.length ? text.length - tail : indexOfCodePoint(text, length - tail);
  return text.slice(0, headEnd) + note + text.slice(tailStart);
}

/** A titled part of a tool's text, its body's trailing newlines taken off (as Python's `rstrip("\n")`; a loop,
 * not a regular expression, which would take quadratic time on a long run of newlines). */
function section(title: string, body: string): string {
  let end = body.length;
  while (end > 0 && body.charCodeAt(end - 1) === 10) end--;
  return `--- ${title} ---\n${body.slice(0, end)}`;
}

/** A command's end for the model: exit code (and why when it did not just exit), stdout, stderr. */
export function commandText(r: CommandResult, limit: number): string {
  let head = `exit code: ${r.exitCode}`;
  if (r.reason !== "exited") head += ` (${r.reason}${r.message ? `: ${r.message}` : ""})`;
  const parts = [head];
  const stdout = r.stdout;
  const stderr = r.stderr;
  if (stdout) parts.push(section("stdout", stdout));
  if (stderr) parts.push(section("stderr", stderr));
  if (parts.length === 1) parts.push("(no output)");
  return clip(parts.join("\n"), limit);
}

/** One rich result: its text/plain, and the other MIME types named (images with their size). */
function resultText(output: CellOutput): string {
  const lines: string[] = [];
  const plain = output.data["text/plain"];
  if (plain !== undefined) lines.push(typeof plain === "string" ? plain : new TextDecoder().decode(plain));
  for (const [mime, value] of Object.entries(output.data)) {
    if (mime === "text/plain") continue;
    const size = value instanceof Uint8Array ? `, ${grouped(value.length)} bytes` : "";
    lines.push(`[${mime}${size}: not shown]`);
  }
  return lines.join("\n");
}

/** A cell's end for the model: its status, printed text, results and error with traceback. */
export function cellText(c: CellResult, limit: number): string {
  let head = `status: ${c.status}`;
  if (c.reason) head += ` (${c.reason})`;
  const parts = [head];
  if (c.text) parts.push(section("output", c.text));
  if (c.results.length) parts.push(section("result", c.results.map(resultText).join("\n")));
  if (c.error !== undefined) {
    let error = `${c.error.name}: ${c.error.value}`;
    if (c.error.traceback.length) error += "\n" + c.error.traceback.join("\n").replace(ANSI, "");
    parts.push(section("error", error));
  }
  if (parts.length === 1) parts.push("(no output)");
  return clip(parts.join("\n"), limit);
}

/** A file's content for the model (a file that is not UTF-8 text is named, not shown). */
export function fileText(path: string, data: Uint8Array, limit: number): string {
  let text: string;
  try {
    // As Python's bytes.decode("utf-8"): strict, and a byte order mark is kept as a character.
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(data);
  } catch {
    return `${path} is not UTF-8 text (${grouped(data.length)} bytes): inspect it with run_python or run_shell.`;
  }
  return text ? clip(text, limit) : `${path} is empty.`;
}

/** What `write_file` says it did. */
export function writtenText(path: string, content: string): string {
  return `wrote ${grouped(new TextEncoder().encode(content).length)} bytes to ${path}`;
}

/** Orders strings by code point, as Python's `sorted` does (JavaScript's `<` compares UTF-16 code units). */
function byCodePoint(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.codePointAt(i) ?? 0;
    const y = b.codePointAt(i) ?? 0;
    if (x !== y) return x - y;
    if (x > 0xffff) i++;
  }
  return a.length - b.length;
}

/** A folder's entries for the model, one a line, ordered by path. */
export function listingText(path: string, files: readonly FileInfo[], limit: number): string {
  if (!files.length) return `${path || "the workspace folder"} is empty.`;
  const lines = [...files]
    .sort((a, b) => byCodePoint(a.path, b.path))
    .map((f) => {
      if (f.isDir) return `${f.path}/`;
      if (f.symlinkTarget) return `${f.path} -> ${f.symlinkTarget}`;
      return `${f.path} (${grouped(f.size)} bytes)`;
    });
  return clip(lines.join("\n"), limit);
}

/** A refused call for the model: the runtime's reason (or the status code's name), its message, the field. */
export function errorText(e: MentisError): string {
  const where = e.field ? ` (${e.field})` : "";
  return `error: ${e.reason || e.code}: ${e.message}${where}`;
}

/** A call the runtime refused, as a tool's error: its message is the text the model reads, its `cause` the
 * MentisError. */
export class SandboxToolError extends Error {
  /** The runtime's refusal. */
  declare readonly cause: MentisError;

  constructor(cause: MentisError) {
    super(errorText(cause), { cause });
    this.name = "SandboxToolError";
  }
}

/** Runs `call`, turning a refusal of the runtime into `refused(e)` (other errors are thrown as they are). */
export async function guarded<T>(
  call: () => Promise<T>,
  refused: (e: MentisError) => T | Promise<T>,
): Promise<T> {
  try {
    return await call();
  } catch (e) {
    if (e instanceof MentisError) return refused(e);
    throw e;
  }
}

/** The options of both frameworks' `sandboxTools`. */
export interface SandboxToolsOptions {
  /** The most characters of one answer given to the model: the middle of a longer one is cut, with a note
   * (0: no limit; default DEFAULT_LIMIT, 20,000). */
  limit?: number;
}

/** Checks `sandboxTools`' arguments: a Sandbox of this package, and a whole number as the limit. */
export function checkArguments(sandbox: unknown, options: SandboxToolsOptions): { sandbox: Sandbox; limit: number } {
  if (!(sandbox instanceof Sandbox)) {
    const what =
      sandbox === null ? "null" : typeof sandbox === "object" ? (sandbox.constructor?.name ?? "an object") : typeof sandbox;
    throw new TypeError(`sandboxTools takes a mentis-sandbox Sandbox, not ${what}`);
  }
  const limit = options.limit ?? DEFAULT_LIMIT;
  if (!Number.isInteger(limit)) {
    throw new RangeError(`limit must be a whole number of characters (0: no limit), not ${limit}`);
  }
  return { sandbox, limit };
}
