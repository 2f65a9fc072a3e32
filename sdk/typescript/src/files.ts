/**
 * The sandbox's files (`sandbox.files`): paths are the sandbox's, relative ones under its work dir, and never
 * lead out of its workspace (docs/FILES.md).
 */
import { stat as localStat } from "node:fs/promises";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { FileType, type FileInfo as FileInfoMessage } from "./gen/mentis/v1/file_pb.js";
import type { Sandbox } from "./sandbox.js";
import { describe, flag, text, whole } from "./args.js";
import { InvalidArgument, MentisError, NotFound } from "./errors.js";
import { sendStream, streamError } from "./streams.js";
import {
  fileChunks,
  localDestination,
  remoteDirDestination,
  remoteFileDestination,
  tarChunks,
  unpack,
  unpackOne,
} from "./transfer.js";
import { type FileEvent, FileWatch } from "./watch.js";

// Writes and uploads are sent in pieces of this size (each one message).
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

/** What `edit` did: how many occurrences it replaced, and the file after. */
export interface EditResult {
  replacements: number;
  file: FileInfo;
}

/** Permission bits as the request carries them (a uint32; the runtime judges which bits it takes). */
function mode(value: unknown): number {
  return whole(value ?? 0, "mode", 0xffff_ffff);
}

function callback(onEvent: unknown): ((event: FileEvent) => void) | undefined {
  if (onEvent !== undefined && typeof onEvent !== "function") {
    throw new InvalidArgument(`onEvent must be a function, not ${describe(onEvent)}`, { field: "onEvent" });
  }
  return onEvent as ((event: FileEvent) => void) | undefined;
}

/** One message of a client stream: its header, or a chunk of data. */
type Piece<H> = { kind: { case: "header"; value: H } | { case: "data"; value: Uint8Array } };

/** A caller's abort, else the call's failure as a typed error (a broken connection: Unavailable). */
function failure(e: unknown, signal: AbortSignal | undefined): unknown {
  if (signal?.aborted) return signal.reason;
  return streamError(e);
}

/** The sandbox's files (sandbox.files). */
export class Files {
  private readonly watches = new Set<FileWatch>();

  constructor(private readonly sandbox: Sandbox) {}

  private get conn() {
    return this.sandbox.connection;
  }

  /**
   * A file's bytes as they come, piece by piece (at most 256 KiB each), from `offset`, at most `length` bytes
   * (0: to the end). Never the whole file in memory: pipe it (`await pipeline(sb.files.readStream(p),
   * createWriteStream(local))`, or `Readable.from(...)`). Leaving the loop early ends the call; `signal` aborts
   * it.
   */
  async *readStream(
    path: string,
    options: { offset?: number; length?: number; signal?: AbortSignal } = {},
  ): AsyncGenerator<Uint8Array> {
    const request = {
      sandboxId: this.sandbox.id,
      path: text(path, "path"),
      offset: BigInt(whole(options.offset ?? 0, "offset")),
      length: BigInt(whole(options.length ?? 0, "length")),
    };
    const call = new AbortController();
    const signal = options.signal;
    const forward = () => call.abort(signal?.reason);
    signal?.addEventListener("abort", forward, { once: true });
    try {
      signal?.throwIfAborted();
      for await (const r of this.conn.files.readFile(request, { signal: call.signal })) yield r.data;
    } catch (e) {
      throw failure(e, signal);
    } finally {
      signal?.removeEventListener("abort", forward);
      call.abort();
    }
  }

  /** A file's bytes. */
  async read(path: string, options: { offset?: number; length?: number; signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    for await (const c of this.readStream(path, options)) chunks.push(c);
    return Buffer.concat(chunks);
  }

  /** A file's text (UTF-8; invalid sequences replaced, a byte-order mark kept). */
  async readText(path: string): Promise<string> {
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(await this.read(path));
  }

  /**
   * Writes a file (made, or replaced), its missing parent folders made; `mode` its permission bits (0: 0644).
   * The runtime puts the new file in place only once all of it came: a stream of `data` that fails (its error
   * is thrown here) or an abort leaves the old file as it was.
   */
  async write(path: string, data: WriteData, options: { mode?: number; signal?: AbortSignal } = {}): Promise<FileInfo> {
    const header = { sandboxId: this.sandbox.id, path: text(path, "path"), mode: mode(options.mode) };
    let pieces: AsyncIterable<Uint8Array | string> | Iterable<Uint8Array | string>;
    if (typeof data === "string" || data instanceof Uint8Array) pieces = [data];
    else if (data && typeof (data as AsyncIterable<unknown>)[Symbol.asyncIterator] === "function") pieces = data;
    else {
      const wrong = `data must be a string, bytes or an async iterable of them, not ${describe(data)}`;
      throw new InvalidArgument(wrong, { field: "data" });
    }
    async function* chunks() {
      for await (const piece of pieces) {
        const bytes = typeof piece === "string" ? new TextEncoder().encode(piece) : piece;
        if (!(bytes instanceof Uint8Array)) {
          throw new InvalidArgument(`data gave ${describe(piece)}, not bytes or a string`, { field: "data" });
        }
        for (let at = 0; at < bytes.length; at += CHUNK) yield bytes.subarray(at, at + CHUNK);
      }
    }
    const r = await this.send((requests, o) => this.conn.files.writeFile(requests, o), header, chunks(), options.signal);
    return fileInfo(r.file);
  }

  /** A client stream of this service (WriteFile or Upload): `header`, then `chunks` (streams.ts' `sendStream`). */
  private send<H, R>(
    call: (requests: AsyncIterable<Piece<H>>, options: { signal: AbortSignal }) => Promise<R>,
    header: H,
    chunks: AsyncIterable<Uint8Array>,
    signal: AbortSignal | undefined,
  ): Promise<R> {
    return sendStream<Piece<H>, R>(
      (requests, callSignal) => call(requests, { signal: callSignal }),
      { kind: { case: "header", value: header } },
      chunks,
      (data) => ({ kind: { case: "data", value: data } }),
      signal,
    );
  }

  /** One page of a folder's entries (`nextPageToken` is "" on the last). */
  async listPage(
    path = "",
    options: { recursive?: boolean; pageSize?: number; pageToken?: string } = {},
  ): Promise<{ files: FileInfo[]; nextPageToken: string; truncated: boolean }> {
    const r = await this.conn.call(() =>
      this.conn.files.listFiles({
        sandboxId: this.sandbox.id,
        path: text(path, "path"),
        recursive: flag(options.recursive, "recursive"),
        pageSize: whole(options.pageSize ?? 0, "pageSize", 0xffff_ffff),
        pageToken: text(options.pageToken ?? "", "pageToken"),
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
    const request = { sandboxId: this.sandbox.id, path: text(path, "path") };
    const r = await this.conn.call(() => this.conn.files.statFile(request));
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

  /** Makes the directory `path` and its missing parents (`mode`: their permission bits; 0 is 0755) and returns
   * it; an existing directory is no error, an existing file is (InvalidArgument). */
  async mkdir(path: string, options: { mode?: number } = {}): Promise<FileInfo> {
    const request = { sandboxId: this.sandbox.id, path: text(path, "path"), mode: mode(options.mode) };
    const r = await this.conn.call(() => this.conn.files.makeDirectory(request));
    return fileInfo(r.directory);
  }

  /** Removes a file, a symbolic link (not what it points to) or an empty directory; with `recursive` also a
   * directory with everything in it (FailedPrecondition without). NotFound when `path` is missing. */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    const recursive = flag(options.recursive, "recursive");
    const request = { sandboxId: this.sandbox.id, path: text(path, "path"), recursive };
    await this.conn.call(() => this.conn.files.deleteFile(request));
  }

  /**
   * Moves or renames a file, a symbolic link (not its target) or a directory within the workspace in one step
   * (rename(2): readers see it at the old path or the new one) and returns what is at `destination` now. The
   * destination's parent must exist (NotFound, reason PATH_NOT_FOUND, otherwise). Something already at
   * `destination` is AlreadyExists (reason PATH_EXISTS) unless `overwrite`, which replaces a file or link with a
   * file or link and an empty directory with a directory (one that is not empty: FailedPrecondition; a file
   * over a directory or the reverse: InvalidArgument). A directory into itself is InvalidArgument.
   */
  async rename(source: string, destination: string, options: { overwrite?: boolean } = {}): Promise<FileInfo> {
    const request = {
      sandboxId: this.sandbox.id,
      source: text(source, "source"),
      destination: text(destination, "destination"),
      overwrite: flag(options.overwrite, "overwrite"),
    };
    const r = await this.conn.call(() => this.conn.files.moveFile(request));
    return fileInfo(r.file);
  }

  /**
   * Replaces `oldString` with `newString` in a text file, in one step (readers see the old file or the new
   * one). `oldString` must occur exactly once, or at least once with `replaceAll` (which replaces each):
   * otherwise FailedPrecondition, and the file is left as it was. An empty `oldString` is InvalidArgument.
   */
  async edit(
    path: string,
    oldString: string,
    newString: string,
    options: { replaceAll?: boolean } = {},
  ): Promise<EditResult> {
    const request = {
      sandboxId: this.sandbox.id,
      path: text(path, "path"),
      oldString: text(oldString, "oldString"),
      newString: text(newString, "newString"),
      replaceAll: flag(options.replaceAll, "replaceAll"),
    };
    const r = await this.conn.call(() => this.conn.files.editFile(request));
    return { replacements: r.replacements, file: fileInfo(r.file) };
  }

  private async isDir(path: string): Promise<boolean> {
    try {
      return (await this.stat(path)).isDir;
    } catch (e) {
      if (e instanceof NotFound) return false;
      throw e;
    }
  }

  /**
   * Copies a local file or directory into the sandbox, as `mentis cp` does, and returns the remote path it was
   * copied to.
   *
   * A file keeps its permission bits; it lands at `remotePath`, or in it under its own name when `remotePath`
   * is "" (the workspace), ends with "/" or is an existing directory. A directory goes as a tar archive,
   * streamed as it is read: into `remotePath/<its name>` when `remotePath` is an existing directory, else into
   * `remotePath` (made when missing), like `cp -r`; existing files there are replaced, others kept. Symbolic
   * links go as links (one that points outside the directory refuses the upload: InvalidArgument). Either way
   * the runtime moves the copy in only once it is whole: a refused, failed or aborted upload (a local file
   * that cannot be read: its error is thrown) leaves no file of it. A missing local path is Node's ENOENT
   * error; one that is neither a file nor a directory InvalidArgument (field `localPath`).
   */
  async upload(localPath: string, remotePath = "", options: { signal?: AbortSignal } = {}): Promise<string> {
    text(localPath, "localPath");
    text(remotePath, "remotePath");
    const st = await localStat(localPath);
    if (!st.isDirectory() && !st.isFile()) {
      throw new InvalidArgument(`${localPath} is neither a file nor a directory`, { field: "localPath" });
    }
    const remoteIsDir = await this.isDir(remotePath);
    const sandboxId = this.sandbox.id;
    if (st.isDirectory()) {
      const path = remoteDirDestination(localPath, remotePath, remoteIsDir);
      const archive = tarChunks(localPath, CHUNK);
      await this.send((requests, o) => this.conn.files.upload(requests, o), { sandboxId, path }, archive, options.signal);
      return path;
    }
    const path = remoteFileDestination(localPath, remotePath, remoteIsDir);
    // Set-id bits make no sense in a sandbox (the runtime refuses them): permission bits and sticky only.
    const header = { sandboxId, path, mode: st.mode & 0o1777 };
    const chunks = fileChunks(localPath, CHUNK);
    await this.send((requests, o) => this.conn.files.writeFile(requests, o), header, chunks, options.signal);
    return path;
  }

  /**
   * Copies a file or directory of the sandbox to this machine, as `mentis cp` does, and returns the local path
   * it was copied to. Both come as a tar archive (Download), unpacked as it arrives, with their permission bits
   * (set-id bits dropped) and modification times; symbolic links come as links. Unpacking never writes outside
   * the destination or through a link.
   *
   * A file lands at `localPath`, or in it under its own name when `localPath` is an existing directory; the
   * file is replaced only once it is complete. A directory lands in `localPath/<its name>` when `localPath` is
   * an existing directory, else in `localPath` (made when missing), like `cp -r`. A missing remote path is
   * NotFound (reason PATH_NOT_FOUND), and nothing is made here.
   */
  async download(remotePath: string, localPath = ".", options: { signal?: AbortSignal } = {}): Promise<string> {
    text(remotePath, "remotePath");
    text(localPath, "localPath");
    const isDir = (await this.stat(remotePath)).isDir;
    const dest = await localDestination(remotePath, localPath);
    const signal = options.signal;
    const call = new AbortController();
    const forward = () => call.abort(signal?.reason);
    signal?.addEventListener("abort", forward, { once: true });
    const responses = this.conn.files.download({ sandboxId: this.sandbox.id, path: remotePath }, { signal: call.signal });
    async function* data(): AsyncGenerator<Uint8Array> {
      try {
        for await (const r of responses) yield r.data;
      } catch (e) {
        throw failure(e, signal);
      }
    }
    try {
      signal?.throwIfAborted();
      if (isDir) await unpack(data(), dest);
      else await unpackOne(data(), dest);
    } finally {
      signal?.removeEventListener("abort", forward);
      call.abort();
    }
    return dest;
  }

  /**
   * Starts watching the directory `path` ("" is the workspace) and, with `recursive`, every directory under
   * it, also those made later (at most 4096 directories). Every change from when this resolves is reported as
   * a `FileEvent`: iterate over the `FileWatch` (`for await`), `read()` it, or pass `onEvent`. A path that is
   * not a directory is InvalidArgument, a missing one NotFound (PATH_NOT_FOUND). A sandbox keeps 16 watches: a
   * new one ends the one read least recently that has no reader, and is FailedPrecondition when all 16 have
   * one. `await using w = await sb.files.watch(...)` closes it at the block's end.
   */
  async watch(path = "", options: { recursive?: boolean; onEvent?: (event: FileEvent) => void } = {}): Promise<FileWatch> {
    const recursive = flag(options.recursive, "recursive");
    const request = { sandboxId: this.sandbox.id, path: text(path, "path"), recursive };
    return this.track(await FileWatch.start(this.conn, request, 0, callback(options.onEvent)));
  }

  /**
   * Reads a watch of this sandbox again by its id (`FileWatch.watchId`), from this process or another: its
   * events after `afterSeq` (`FileWatch.lastSeq` of the reader before; 0: every event still kept) first, a
   * `gap` event first when some of them are gone, then live ones. NotFound (PATH_NOT_FOUND) for a watch that
   * ended (nobody read it for 5 minutes, or the sandbox restarted), OutOfRange (SEQ_OUT_OF_RANGE) for an
   * `afterSeq` beyond its newest event. An empty id is InvalidArgument here (it would start a new watch).
   */
  async attachWatch(
    watchId: string,
    options: { afterSeq?: number; onEvent?: (event: FileEvent) => void } = {},
  ): Promise<FileWatch> {
    const afterSeq = whole(options.afterSeq ?? 0, "afterSeq");
    if (typeof watchId !== "string" || !watchId) {
      throw new InvalidArgument(`watchId must name a watch, not ${describe(watchId)}`, { field: "watchId" });
    }
    const request = { sandboxId: this.sandbox.id, watchId, afterSeq: BigInt(afterSeq) };
    return this.track(await FileWatch.start(this.conn, request, afterSeq, callback(options.onEvent)));
  }

  private track(watch: FileWatch): FileWatch {
    this.watches.add(watch);
    const forget = () => this.watches.delete(watch);
    watch.wait().then(forget, forget);
    return watch;
  }

  /** Closes every watch this object opened (the sandbox's `close()` does). @internal */
  async closeWatches(): Promise<void> {
    await Promise.all([...this.watches].map((w) => w.close()));
  }
}
