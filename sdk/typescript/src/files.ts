/**
 * The sandbox's files (`sandbox.files`): paths are the sandbox's, relative ones under its work dir, and never
 * lead out of its workspace (docs/FILES.md).
 */
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { FileType, type FileInfo as FileInfoMessage } from "./gen/mentis/v1/file_pb.js";
import type { Sandbox } from "./sandbox.js";
import { fromConnectError, MentisError } from "./errors.js";

// Writes are sent in pieces of this size (each one message).
const CHUNK = 1 << 20;

/** A file, folder or link of the sandbox. */
export interface FileInfo {
  path: string;
  /** The last part of the path. */
  name: string;
  type: "file" | "directory" | "symlink" | "other" | "unspecified";
  isDir: boolean;
  size: number;
  /** The permission bits (0o644). */
  mode: number;
  modifiedAt: Date | undefined;
  /** Where a symbolic link points ("" for anything else). */
  symlinkTarget: string;
}

export function fileInfo(m: FileInfoMessage | undefined): FileInfo {
  if (!m) throw new MentisError("the runtime's answer lacks its file");
  const type = (FileType[m.type] ?? "UNSPECIFIED").toLowerCase() as FileInfo["type"];
  return {
    path: m.path,
    name: m.path.replace(/\/+$/, "").split("/").pop() ?? m.path,
    type,
    isDir: m.type === FileType.DIRECTORY,
    size: Number(m.size),
    mode: m.mode,
    modifiedAt: m.modifyTime ? timestampDate(m.modifyTime) : undefined,
    symlinkTarget: m.symlinkTarget,
  };
}

/** What `write` takes: text (UTF-8), bytes, or a stream of bytes (a Node Readable is one). */
export type WriteData = string | Uint8Array | AsyncIterable<Uint8Array | string>;

/** The sandbox's files (sandbox.files). */
export class Files {
  constructor(private readonly sandbox: Sandbox) {}

  private get conn() {
    return this.sandbox.connection;
  }

  /** A file's bytes as they come, piece by piece. */
  async *readStream(path: string, options: { offset?: number; length?: number } = {}): AsyncGenerator<Uint8Array> {
    const stream = this.conn.files.readFile({
      sandboxId: this.sandbox.id,
      path,
      offset: BigInt(options.offset ?? 0),
      length: BigInt(options.length ?? 0),
    });
    try {
      for await (const r of stream) yield r.data;
    } catch (e) {
      throw fromConnectError(e);
    }
  }

  /** A file's bytes. */
  async read(path: string, options: { offset?: number; length?: number } = {}): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    for await (const c of this.readStream(path, options)) chunks.push(c);
    return Buffer.concat(chunks);
  }

  /** A file's text (UTF-8; invalid sequences replaced, a byte-order mark kept). */
  async readText(path: string): Promise<string> {
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(await this.read(path));
  }

  /** Writes a file (made, or replaced), its missing parent folders made; `mode` its permission bits. */
  async write(path: string, data: WriteData, options: { mode?: number } = {}): Promise<FileInfo> {
    const sandboxId = this.sandbox.id;
    async function* requests() {
      yield { kind: { case: "header" as const, value: { sandboxId, path, mode: options.mode ?? 0 } } };
      const pieces: AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string> =
        typeof data === "string" || data instanceof Uint8Array ? [data] : data;
      for await (const piece of pieces) {
        const bytes = typeof piece === "string" ? new TextEncoder().encode(piece) : piece;
        for (let at = 0; at < bytes.length; at += CHUNK) {
          yield { kind: { case: "data" as const, value: bytes.subarray(at, at + CHUNK) } };
        }
      }
    }
    const r = await this.conn.call(() => this.conn.files.writeFile(requests()));
    return fileInfo(r.file);
  }

  /** One page of a folder's entries (`nextPageToken` is "" on the last). */
  async listPage(
    path = "",
    options: { recursive?: boolean; pageSize?: number; pageToken?: string } = {},
  ): Promise<{ files: FileInfo[]; nextPageToken: string; truncated: boolean }> {
    const r = await this.conn.call(() =>
      this.conn.files.listFiles({
        sandboxId: this.sandbox.id,
        path,
        recursive: options.recursive ?? false,
        pageSize: options.pageSize ?? 0,
        pageToken: options.pageToken ?? "",
      }),
    );
    return { files: r.files.map(fileInfo), nextPageToken: r.nextPageToken, truncated: r.truncated };
  }

  /** A folder's entries (the work dir when no path is given), every page; `recursive` walks below it. */
  async list(path = "", options: { recursive?: boolean; pageSize?: number } = {}): Promise<FileInfo[]> {
    const found: FileInfo[] = [];
    let pageToken = "";
    do {
      const page = await this.listPage(path, { ...options, pageToken });
      found.push(...page.files);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return found;
  }

  /** A path's kind, size, mode and time (NotFound when nothing is there). */
  async stat(path: string): Promise<FileInfo> {
    const r = await this.conn.call(() => this.conn.files.statFile({ sandboxId: this.sandbox.id, path }));
    return fileInfo(r.file);
  }

  /** Whether anything is at `path`. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof MentisError && e.code === "NOT_FOUND") return false;
      throw e;
    }
  }
}
