/**
 * Upload and download between local paths and a sandbox's workspace: the tar archives and where copies land,
 * as the Python SDK's `_transfer.py` (and `mentis cp`) does.
 *
 * A local file goes up as a file (WriteFile, with its permission bits), a directory as a tar archive (Upload);
 * a remote directory comes down as a tar archive (Download), and so does one file (Download archives it under
 * its own name, with its mode). A directory lands *in* a destination that is an existing directory
 * (`dest/<name>`), else *as* the destination, like `cp -r`.
 *
 * The archive going up is written entry by entry while it is sent, a file `chunk` bytes at a time; the one
 * coming down is unpacked as it arrives. Unpacking keeps every entry inside the destination: no absolute
 * names, no "..", nothing written through a symbolic link (a sandbox's files are not to be trusted), and no
 * set-id bits.
 *
 * The tar format itself (headers, PAX and GNU extensions, checksums, padding) is tar-stream's, a small, much
 * used streaming writer and reader without native code; what is ours is above it: the walk, which headers go
 * up (PAX where Python's tarfile writes one, so the runtime's Upload reads what it reads from the Python SDK),
 * the pacing and where everything lands.
 */
import { constants, type BigIntStats } from "node:fs";
import {
  chmod,
  link,
  lstat,
  mkdir,
  mkdtemp,
  open,
  readdir,
  readlink,
  rename,
  rm,
  stat,
  symlink,
  unlink,
  utimes,
} from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import type { Writable } from "node:stream";
import { extract, pack, type Entry, type Headers, type Pack } from "tar-stream";
import { MentisError } from "./errors.js";

// --- where copies land

/** The last component of `path` (trailing slashes ignored); undefined for "", ".", ".." and "/". */
export function baseName(path: string): string | undefined {
  const name = path.replace(/\/+$/, "").split("/").pop() ?? "";
  return name === "" || name === "." || name === ".." ? undefined : name;
}

function joinRemote(directory: string, name: string): string {
  const dir = directory.replace(/\/+$/, "");
  return dir ? `${dir}/${name}` : name;
}

async function isLocalDir(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isDirectory();
  } catch {
    return false;
  }
}

/** Where a download of `remotePath` lands: in `localPath` when it is an existing directory (under the remote's
 * name), else at `localPath`. */
export async function localDestination(remotePath: string, localPath: string): Promise<string> {
  const name = baseName(remotePath);
  if (name !== undefined && (await isLocalDir(localPath))) return join(localPath, name);
  return localPath;
}

/** Where an upload of local file `local` lands: in `remotePath` when it is "" (the workspace), ends with "/"
 * or is an existing directory (under the local name), else at `remotePath`. */
export function remoteFileDestination(local: string, remotePath: string, remoteIsDir: boolean): string {
  if (!remotePath || remotePath.endsWith("/") || remoteIsDir) {
    return joinRemote(remotePath, local.replace(/\/+$/, "").split("/").pop() ?? local);
  }
  return remotePath;
}

/** Where an upload of local directory `local` lands: in `remotePath` when it is an existing directory (under
 * the local name; "" is the workspace), else at `remotePath`. */
export function remoteDirDestination(local: string, remotePath: string, remoteIsDir: boolean): string {
  const name = baseName(local);
  if (remoteIsDir && name !== undefined) return joinRemote(remotePath, name);
  return remotePath.replace(/\/+$/, "");
}

// --- a file, or a directory as a tar archive, in pieces

/** A local file's bytes, `chunk` at a time (a fresh buffer each: the pieces are sent as they are). */
export async function* fileChunks(path: string, chunk: number): AsyncGenerator<Uint8Array> {
  const fh = await open(path, "r");
  try {
    for (;;) {
      const buf = new Uint8Array(chunk);
      const { bytesRead } = await fh.read(buf, 0, chunk, null);
      if (bytesRead === 0) return;
      yield buf.subarray(0, bytesRead);
    }
  } finally {
    await fh.close();
  }
}

/**
 * The tar archive of directory `root`'s contents (names relative to it, sorted, a directory before what it
 * holds; symbolic links and hard links as links), in pieces of about `chunk` bytes, made as they are taken: an
 * entry is added only when the archive's taker has caught up with the one before.
 */
export async function* tarChunks(root: string, chunk: number): AsyncGenerator<Uint8Array> {
  const archive = pack();
  archive.on("error", () => {}); // given to the taker by the archive's iterator
  const packing = packTree(archive, root, chunk).then(
    () => archive.finalize(),
    (e: unknown) => archive.destroy(e as Error),
  );
  try {
    yield* rechunk(archive, chunk);
  } finally {
    archive.destroy(); // a taker that stopped early; nothing once the archive ended
    await packing;
  }
}

async function packTree(archive: Pack, root: string, chunk: number): Promise<void> {
  const inodes = new Map<string, string>();
  for await (const [path, name] of walk(root, "")) {
    let st: BigIntStats;
    try {
      st = await lstat(path, { bigint: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") continue; // removed while we archive
      throw e;
    }
    const entry: EntryFields = {
      name,
      mode: Number(st.mode),
      uid: Number(st.uid),
      gid: Number(st.gid),
      size: 0,
      mtime: Number(st.mtimeNs / 1_000_000_000n),
      type: "file",
      linkname: "",
      devmajor: 0,
      devminor: 0,
    };
    if (st.isFile()) {
      const inode = `${st.dev}:${st.ino}`;
      const earlier = inodes.get(inode);
      if (st.nlink > 1n && earlier !== undefined && earlier !== name) {
        entry.type = "link"; // a hard link to a file archived before
        entry.linkname = earlier;
      } else {
        inodes.set(inode, name);
        entry.size = Number(st.size);
      }
    } else if (st.isDirectory()) {
      entry.type = "directory";
      entry.name = `${name}/`;
    } else if (st.isSymbolicLink()) {
      entry.type = "symlink";
      entry.linkname = await readlink(path);
    } else if (st.isFIFO()) {
      entry.type = "fifo";
    } else if (st.isCharacterDevice() || st.isBlockDevice()) {
      entry.type = st.isCharacterDevice() ? "character-device" : "block-device";
      entry.devmajor = Number(st.rdev >> 8n) & 0xfff;
      entry.devminor = Number((st.rdev & 0xffn) | ((st.rdev >> 12n) & 0xfff00n));
    } else {
      continue; // a socket: nothing to archive
    }
    const [sink, added] = addEntry(archive, entry);
    if (entry.size) {
      const fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
      try {
        let left = entry.size;
        while (left) {
          // A Buffer, which tar-stream passes on as it is (another Uint8Array it would copy).
          const buf = Buffer.alloc(Math.min(chunk, left));
          const { bytesRead } = await fh.read(buf, 0, buf.length, null);
          if (!bytesRead) throw new Error(`${path} shrank while it was being uploaded`);
          left -= bytesRead;
          if (!sink.write(buf.subarray(0, bytesRead)) && !(await drained(sink))) break; // the archive was closed
        }
      } finally {
        await fh.close();
      }
    }
    sink.end();
    await added;
  }
}

/** What we know of an entry going up: the fields of tar-stream's header, `mtime` in seconds. */
interface EntryFields {
  name: string;
  /** As lstat gives it, with the file-type bits (tar keeps the permission bits). */
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtime: number;
  type: NonNullable<Headers["type"]>;
  linkname: string;
  devmajor: number;
  devminor: number;
}

const isAscii = (s: string) => /^[\x00-\x7f]*$/.test(s);

/**
 * Adds an entry to the archive: its writable content, and a promise settled once the entry is whole in the
 * archive (rejected when the archive was destroyed first).
 *
 * The header is tar-stream's ustar header, after a PAX header (path and linkpath, and what a number field
 * cannot hold) when Python's tarfile writes one for PAX_FORMAT: a name or link over 100 bytes or not ASCII, or
 * a number too big for its field. tar-stream would rather split a long ASCII name into ustar's prefix and name
 * fields; a `pax` record set makes it write the PAX header instead.
 */
function addEntry(archive: Pack, f: EntryFields): [Writable, Promise<void>] {
  const pax: Record<string, string> = {};
  let needsPax = false;
  for (const text of [f.name, f.linkname]) {
    if (!isAscii(text) || text.length > 100) needsPax = true;
  }
  // tar-stream's fields: 6 octal digits for ids, 11 for the size (base-256 beyond), and seconds as a signed
  // 32-bit number; what does not fit goes in the PAX header, with 0 in the field as tarfile does.
  const fits = (value: number, below: number) => value >= 0 && value < below;
  for (const [key, value, below] of [
    ["uid", f.uid, 8 ** 6],
    ["gid", f.gid, 8 ** 6],
    ["size", f.size, 8 ** 11],
    ["mtime", f.mtime, 2 ** 31],
  ] as const) {
    if (!fits(value, below)) {
      pax[key] = String(value);
      needsPax = true;
    }
  }
  const header: Headers & { pax?: Record<string, string> } = {
    name: f.name,
    // Never 0, which tar-stream would take as "no mode" and replace with 644 or 755: the file-type bits stay
    // set (the header keeps the permission bits alone).
    mode: f.mode,
    uid: fits(f.uid, 8 ** 6) ? f.uid : 0,
    gid: fits(f.gid, 8 ** 6) ? f.gid : 0,
    size: f.size,
    mtime: new Date(fits(f.mtime, 2 ** 31) ? f.mtime * 1000 : 0),
    type: f.type,
    linkname: f.linkname,
    devmajor: f.devmajor,
    devminor: f.devminor,
  };
  if (needsPax) header.pax = pax;
  let settle: (e?: Error | null) => void = () => {};
  const added = new Promise<void>((resolve, reject) => {
    settle = (e) => (e ? reject(e) : resolve());
  });
  added.catch(() => {}); // awaited by the caller, unless it failed first
  const sink = archive.entry(header, (e) => settle(e));
  sink.on("error", () => {}); // told through `added`
  return [sink, added];
}

/** Resolves when `stream` takes writes again: true, or false once it was closed. */
function drained(stream: Writable): Promise<boolean> {
  if (stream.destroyed) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (open: boolean) => () => {
      stream.off("drain", onDrain);
      stream.off("close", onClose);
      resolve(open);
    };
    const onDrain = done(true);
    const onClose = done(false);
    stream.once("drain", onDrain);
    stream.once("close", onClose);
  });
}

function byName(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

async function* walk(directory: string, prefix: string): AsyncGenerator<[string, string]> {
  const entries = (await readdir(directory, { withFileTypes: true })).sort((a, b) => byName(a.name, b.name));
  for (const entry of entries) {
    const path = join(directory, entry.name);
    const name = prefix + entry.name;
    yield [path, name];
    if (entry.isDirectory()) yield* walk(path, `${name}/`);
  }
}

/** The pieces of `pieces` in chunks of about `size` bytes (small pieces gathered, large ones as they are). */
export async function* rechunk(
  pieces: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  size: number,
): AsyncGenerator<Uint8Array> {
  let held: Uint8Array[] = [];
  let n = 0;
  for await (const piece of pieces) {
    if (!n && piece.length >= size) {
      yield piece;
      continue;
    }
    held.push(piece);
    n += piece.length;
    if (n >= size) {
      yield Buffer.concat(held, n);
      held = [];
      n = 0;
    }
  }
  if (n) yield Buffer.concat(held, n);
}


// --- reading a tar stream

/** One entry of an archive being read. */
export interface TarEntry {
  name: string;
  type: "file" | "directory" | "symlink" | "link" | "other";
  mode: number;
  /** Seconds since the epoch. */
  mtime: number;
  linkname: string;
  /** Its content, as it comes; what is not read of it is skipped when the next entry is asked for. */
  body: AsyncIterable<Uint8Array>;
}

function archiveError(message: string): MentisError {
  return new MentisError(`the archive from the sandbox cannot be read: ${message}`);
}

const kinds: Partial<Record<string, TarEntry["type"]>> = {
  file: "file",
  "contiguous-file": "file",
  link: "link",
  symlink: "symlink",
  directory: "directory",
};

/**
 * The entries of the tar stream `chunks` (ustar, GNU and PAX, read by tar-stream), one at a time, as the bytes
 * come: the stream is fed to the reader only as fast as the entries' contents are taken. An error of `chunks`
 * is thrown as it is; an archive that cannot be read is a MentisError.
 */
export async function* tarEntries(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<TarEntry> {
  // Unknown formats too: the old (v7) tar header has no magic.
  const archive = extract({ allowUnknownFormat: true });
  let failed: { error: unknown } | undefined;
  const readError = (e: unknown) =>
    failed && e === failed.error ? e : archiveError(e instanceof Error ? e.message : String(e));
  void (async () => {
    try {
      for await (const piece of chunks) {
        if (!archive.write(piece) && !(await drained(archive))) return; // the reader was closed
      }
      archive.end();
    } catch (e) {
      failed = { error: e };
      archive.destroy(e as Error);
    }
  })();
  const entries = archive[Symbol.asyncIterator]();
  try {
    for (;;) {
      let next: IteratorResult<Entry>;
      try {
        next = await entries.next();
      } catch (e) {
        throw readError(e);
      }
      if (next.done) return;
      const stream = next.value;
      const h = stream.header as Headers & { pax?: Record<string, string> | null };
      // A PAX mtime may have a fraction; tar-stream leaves it in the records.
      const paxTime = Number(h.pax?.mtime ?? Number.NaN);
      const mtime = Number.isFinite(paxTime) ? Math.floor(paxTime) : Math.floor((h.mtime?.getTime() ?? 0) / 1000);
      async function* body(): AsyncGenerator<Uint8Array> {
        try {
          for await (const piece of stream) yield piece;
        } catch (e) {
          throw readError(e);
        }
      }
      yield {
        name: h.name,
        type: kinds[h.type ?? ""] ?? "other",
        mode: h.mode ?? 0,
        mtime,
        linkname: h.linkname ?? "",
        body: body(),
      };
      stream.resume(); // what was not read: skipped
    }
  } finally {
    try {
      await entries.return?.();
    } catch {
      // closed already, by the error thrown
    }
  }
}

// --- unpacking, safely

function parts(name: string): string[] {
  if (name.startsWith("/")) throw new MentisError(`archive entry ${JSON.stringify(name)} has an absolute name`);
  const found = name.split("/").filter((p) => p !== "" && p !== ".");
  if (found.includes("..")) {
    throw new MentisError(`archive entry ${JSON.stringify(name)} leaves the destination ("..")`);
  }
  return found;
}

async function lstatOrUndefined(path: string) {
  try {
    return await lstat(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw e;
  }
}

/** The path of `names` under `target`, making missing parent directories (when `make`); MentisError when a
 * parent on the way is a symbolic link or not a directory. */
async function inside(target: string, names: string[], shown: string, make = true): Promise<string> {
  if (!names.length) throw new MentisError(`archive link ${JSON.stringify(shown)} names the destination itself`);
  let here = target;
  for (const part of names.slice(0, -1)) {
    here = join(here, part);
    const st = await lstatOrUndefined(here);
    if (!st) {
      if (!make) {
        throw new MentisError(`archive link ${JSON.stringify(shown)} points to nothing earlier in the archive`);
      }
      await mkdir(here, 0o755);
      continue;
    }
    if (!st.isDirectory()) {
      throw new MentisError(`archive entry ${JSON.stringify(shown)} goes through ${here}, which is not a directory`);
    }
  }
  return join(here, names[names.length - 1] as string);
}

/** Makes room for a file or link at `dest`: an existing file or link is removed (never followed). */
async function clear(dest: string): Promise<void> {
  const st = await lstatOrUndefined(dest);
  if (!st) return;
  if (st.isDirectory()) {
    throw Object.assign(new Error(`${dest} is a directory; the archive has a file there`), { code: "EISDIR" });
  }
  await unlink(dest);
}

/** Unpacks the tar stream `chunks` into directory `target` (created when missing), read as it comes. */
export async function unpack(chunks: AsyncIterable<Uint8Array>, target: string): Promise<void> {
  await mkdir(target, { recursive: true });
  const directories: [string, number, number][] = [];
  for await (const entry of tarEntries(chunks)) {
    const names = parts(entry.name);
    if (!names.length) continue; // the directory itself
    const dest = await inside(target, names, entry.name);
    const mode = entry.mode & 0o777;
    if (entry.type === "directory") {
      const st = await lstatOrUndefined(dest);
      if (st && !st.isDirectory()) await unlink(dest); // a file or a link where the archive has a directory
      if (!st || !st.isDirectory()) await mkdir(dest, 0o700);
      directories.push([dest, mode, entry.mtime]);
    } else if (entry.type === "file") {
      await clear(dest);
      const fh = await open(dest, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
      try {
        for await (const piece of entry.body) {
          let at = 0;
          while (at < piece.length) at += (await fh.write(piece, at)).bytesWritten;
        }
        await fh.chmod(mode);
        await fh.utimes(entry.mtime, entry.mtime);
      } finally {
        await fh.close();
      }
    } else if (entry.type === "symlink") {
      await clear(dest);
      await symlink(entry.linkname, dest);
    } else if (entry.type === "link") {
      const source = await inside(target, parts(entry.linkname), entry.linkname, false);
      await clear(dest);
      await link(source, dest);
    }
    // Devices and fifos are never made here.
  }
  // Directory modes last, deepest first, so a read-only directory could still be filled.
  for (const [path, mode, mtime] of directories.reverse()) {
    await chmod(path, mode);
    await utimes(path, mtime, mtime);
  }
}

/** Unpacks a one-entry archive (a Download of one file) to `dest`, through a temporary folder beside it, so
 * `dest` is replaced only by a complete file. */
export async function unpackOne(chunks: AsyncIterable<Uint8Array>, dest: string): Promise<void> {
  const parent = dirname(resolve(dest));
  await mkdir(parent, { recursive: true });
  const staging = await mkdtemp(join(parent, ".mentis-download-"));
  try {
    await unpack(chunks, staging);
    const entries = await readdir(staging);
    if (entries.length !== 1) {
      throw new MentisError(`the download held ${entries.length} entries where one file was expected`);
    }
    await rename(join(staging, entries[0] as string), dest);
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}
