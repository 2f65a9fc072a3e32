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
import { MentisError } from "./errors.js";

const BLOCK = 512;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

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
 * holds; symbolic links and hard links as links), in pieces of about `chunk` bytes, made as they are taken.
 */
export function tarChunks(root: string, chunk: number): AsyncGenerator<Uint8Array> {
  return rechunk(tarPieces(root, chunk), chunk);
}

async function* tarPieces(root: string, chunk: number): AsyncGenerator<Uint8Array> {
  const inodes = new Map<string, string>();
  for await (const [path, name] of walk(root, "")) {
    let st: BigIntStats;
    try {
      st = await lstat(path, { bigint: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") continue; // removed while we archive
      throw e;
    }
    const entry: HeaderFields = {
      name,
      mode: Number(st.mode & 0o7777n),
      uid: Number(st.uid),
      gid: Number(st.gid),
      size: 0,
      mtime: Number(st.mtimeNs / 1_000_000_000n),
      type: "0",
      linkname: "",
      devmajor: 0,
      devminor: 0,
    };
    let size = 0;
    if (st.isFile()) {
      const inode = `${st.dev}:${st.ino}`;
      const earlier = inodes.get(inode);
      if (st.nlink > 1n && earlier !== undefined && earlier !== name) {
        entry.type = "1"; // a hard link to a file archived before
        entry.linkname = earlier;
      } else {
        inodes.set(inode, name);
        size = Number(st.size);
        entry.size = size;
      }
    } else if (st.isDirectory()) {
      entry.type = "5";
      entry.name = `${name}/`;
    } else if (st.isSymbolicLink()) {
      entry.type = "2";
      entry.linkname = await readlink(path);
    } else if (st.isFIFO()) {
      entry.type = "6";
    } else if (st.isCharacterDevice() || st.isBlockDevice()) {
      entry.type = st.isCharacterDevice() ? "3" : "4";
      entry.devmajor = Number(st.rdev >> 8n) & 0xfff;
      entry.devminor = Number((st.rdev & 0xffn) | ((st.rdev >> 12n) & 0xfff00n));
    } else {
      continue; // a socket: nothing to archive
    }
    yield headerBlocks(entry);
    if (size) {
      const fh = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
      try {
        let left = size;
        while (left) {
          const buf = new Uint8Array(Math.min(chunk, left));
          const { bytesRead } = await fh.read(buf, 0, buf.length, null);
          if (!bytesRead) throw new Error(`${path} shrank while it was being uploaded`);
          left -= bytesRead;
          yield buf.subarray(0, bytesRead);
        }
      } finally {
        await fh.close();
      }
      const pad = -size & (BLOCK - 1);
      if (pad) yield new Uint8Array(pad);
    }
  }
  yield new Uint8Array(2 * BLOCK); // the end of the archive
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

async function* rechunk(pieces: AsyncIterable<Uint8Array>, size: number): AsyncGenerator<Uint8Array> {
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
      yield concat(held, n);
      held = [];
      n = 0;
    }
  }
  if (n) yield concat(held, n);
}

function concat(pieces: Uint8Array[], n: number): Uint8Array {
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of pieces) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

// --- tar headers

interface HeaderFields {
  name: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtime: number;
  /** The type flag: "0" file, "1" hard link, "2" symbolic link, "5" directory, ... */
  type: string;
  linkname: string;
  devmajor: number;
  devminor: number;
}

const isAscii = (s: string) => /^[\x00-\x7f]*$/.test(s);

/** The header block of an entry, after a PAX header with what the ustar fields cannot hold (long or non-ASCII
 * names, big numbers), as Python's tarfile writes PAX_FORMAT. */
function headerBlocks(f: HeaderFields): Uint8Array {
  const pax: [string, string][] = [];
  for (const [key, value] of [
    ["path", f.name],
    ["linkpath", f.linkname],
  ] as const) {
    if (!isAscii(value) || value.length > 100) pax.push([key, value]);
  }
  for (const [key, value, digits] of [
    ["uid", f.uid, 8],
    ["gid", f.gid, 8],
    ["size", f.size, 12],
    ["mtime", f.mtime, 12],
  ] as const) {
    if (!(value >= 0 && value < 8 ** (digits - 1))) pax.push([key, String(value)]);
  }
  const main = ustarBlock(f);
  if (!pax.length) return main;
  const records = encoder.encode(pax.map(([k, v]) => paxRecord(k, v)).join(""));
  const paxHeader = ustarBlock({
    name: "././@PaxHeader",
    mode: 0o644,
    uid: 0,
    gid: 0,
    size: records.length,
    mtime: 0,
    type: "x",
    linkname: "",
    devmajor: 0,
    devminor: 0,
  });
  const out = new Uint8Array(BLOCK + padded(records.length) + BLOCK);
  out.set(paxHeader, 0);
  out.set(records, BLOCK);
  out.set(main, BLOCK + padded(records.length));
  return out;
}

function paxRecord(key: string, value: string): string {
  // "%d %s=%s\n", the length counting itself.
  const body = ` ${key}=${value}\n`;
  const bodyLength = encoder.encode(body).length;
  let n = bodyLength + 1;
  while (String(n).length + bodyLength !== n) n = String(n).length + bodyLength;
  return `${n}${body}`;
}

function padded(n: number): number {
  return Math.ceil(n / BLOCK) * BLOCK;
}

function ustarBlock(f: HeaderFields): Uint8Array {
  const block = new Uint8Array(BLOCK);
  const put = (at: number, length: number, text: string) => {
    // The field's text, ASCII (what does not fit goes in the PAX header before), cut to the field.
    const bytes = encoder.encode(text.replace(/[^\x00-\x7f]/g, "?")).subarray(0, length);
    block.set(bytes, at);
  };
  const octal = (at: number, length: number, value: number) => {
    const v = value >= 0 && value < 8 ** (length - 1) ? value : 0;
    put(at, length, `${v.toString(8).padStart(length - 1, "0")}\0`);
  };
  put(0, 100, f.name);
  octal(100, 8, f.mode);
  octal(108, 8, f.uid);
  octal(116, 8, f.gid);
  octal(124, 12, f.size);
  octal(136, 12, f.mtime);
  put(148, 8, "        ");
  put(156, 1, f.type);
  put(157, 100, f.linkname);
  put(257, 6, "ustar\0");
  put(263, 2, "00");
  octal(329, 8, f.devmajor);
  octal(337, 8, f.devminor);
  let sum = 0;
  for (const b of block) sum += b;
  put(148, 8, `${sum.toString(8).padStart(6, "0")}\0 `);
  return block;
}

// --- reading a tar stream

/** One entry of an archive being read. */
export interface TarEntry {
  name: string;
  type: "file" | "directory" | "symlink" | "link" | "other";
  mode: number;
  /** Seconds since the epoch. */
  mtime: number;
  size: number;
  linkname: string;
}

function archiveError(message: string): MentisError {
  return new MentisError(`the archive from the sandbox cannot be read: ${message}`);
}

/** Bytes from an iterator of chunks, taken as asked for, never more than one chunk held beyond what is
 * asked. */
class Bytes {
  private held: Uint8Array[] = [];
  private size = 0;
  private ended = false;

  constructor(private readonly it: AsyncIterator<Uint8Array>) {}

  /** Until `n` bytes are held, or the stream ended. */
  private async fill(n: number): Promise<void> {
    while (this.size < n && !this.ended) {
      const r = await this.it.next();
      if (r.done) {
        this.ended = true;
      } else if (r.value.length) {
        this.held.push(r.value);
        this.size += r.value.length;
      }
    }
  }

  /** Exactly `n` bytes; undefined when the stream ended before the first of them. */
  async exact(n: number): Promise<Uint8Array | undefined> {
    await this.fill(n);
    if (this.size === 0) return undefined;
    if (this.size < n) throw archiveError("it ends inside a header");
    const out = new Uint8Array(n);
    let at = 0;
    for (const piece of this.pieces(n)) {
      out.set(piece, at);
      at += piece.length;
    }
    return out;
  }

  /** Takes up to `n` held bytes, in the pieces they are held in. */
  private *pieces(n: number): Generator<Uint8Array> {
    let left = n;
    while (left > 0 && this.held.length) {
      const first = this.held[0] as Uint8Array;
      if (first.length <= left) {
        this.held.shift();
        this.size -= first.length;
        left -= first.length;
        yield first;
      } else {
        this.held[0] = first.subarray(left);
        this.size -= left;
        yield first.subarray(0, left);
        left = 0;
      }
    }
  }

  /** `n` bytes, piece by piece as they come. */
  async *stream(n: number): AsyncGenerator<Uint8Array> {
    let left = n;
    while (left > 0) {
      await this.fill(1);
      if (!this.size) throw archiveError("it ends inside an entry");
      for (const piece of this.pieces(left)) {
        left -= piece.length;
        yield piece;
      }
    }
  }

  async skip(n: number): Promise<void> {
    for await (const _ of this.stream(n)) {
      // dropped
    }
  }
}

function field(block: Uint8Array, at: number, length: number): string {
  const bytes = block.subarray(at, at + length);
  const end = bytes.indexOf(0);
  return decoder.decode(end < 0 ? bytes : bytes.subarray(0, end));
}

function number(block: Uint8Array, at: number, length: number): number {
  const bytes = block.subarray(at, at + length);
  if ((bytes[0] ?? 0) & 0x80) {
    // GNU's base-256: big-endian, the first byte's high bit a mark.
    if (bytes[0] === 0xff) throw archiveError("a negative number in a header");
    let v = BigInt((bytes[0] ?? 0) & 0x7f);
    for (const b of bytes.subarray(1)) v = (v << 8n) | BigInt(b);
    return Number(v);
  }
  const text = field(block, at, length).trim();
  if (!text) return 0;
  if (!/^[0-7]+$/.test(text)) throw archiveError(`${JSON.stringify(text)} is no octal number`);
  return parseInt(text, 8);
}

function checksumOk(block: Uint8Array): boolean {
  const want = number(block, 148, 8);
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const b = i >= 148 && i < 156 ? 0x20 : (block[i] as number);
    unsigned += b;
    signed += b > 127 ? b - 256 : b;
  }
  return want === unsigned || want === signed;
}

function paxRecords(data: Uint8Array): Map<string, string> {
  const out = new Map<string, string>();
  let at = 0;
  while (at < data.length) {
    const space = data.indexOf(0x20, at);
    if (space < 0) break;
    const length = parseInt(decoder.decode(data.subarray(at, space)), 10);
    if (!(length > 0) || at + length > data.length) throw archiveError("a bad PAX header");
    const record = decoder.decode(data.subarray(space + 1, at + length - 1));
    const eq = record.indexOf("=");
    if (eq > 0) out.set(record.slice(0, eq), record.slice(eq + 1));
    at += length;
  }
  return out;
}

/** The entries of a tar stream (ustar, GNU and PAX), one at a time: `next()` reads the next header, `body()`
 * the current entry's content as it comes (what is not read of it is skipped by the next `next()`). */
export class TarReader {
  private readonly bytes: Bytes;
  // What is left of the current entry: its content, then the padding to a whole block.
  private content = 0;
  private padding = 0;
  private global = new Map<string, string>();

  constructor(chunks: AsyncIterable<Uint8Array>) {
    this.bytes = new Bytes(chunks[Symbol.asyncIterator]());
  }

  async next(): Promise<TarEntry | undefined> {
    await this.bytes.skip(this.content + this.padding);
    this.content = this.padding = 0;
    let longName: string | undefined;
    let longLink: string | undefined;
    let pax = new Map<string, string>();
    for (;;) {
      const block = await this.bytes.exact(BLOCK);
      if (!block || block.every((b) => b === 0)) return undefined; // the end of the archive
      if (!checksumOk(block)) throw archiveError("a header's checksum is wrong");
      const type = String.fromCharCode(block[156] ?? 0);
      let size = number(block, 124, 12);
      if (type === "L" || type === "K" || type === "x" || type === "g") {
        if (size > 1 << 20) throw archiveError("an extended header over 1 MiB");
        const data = (await this.bytes.exact(padded(size))) ?? new Uint8Array();
        if (data.length < size) throw archiveError("it ends inside an extended header");
        const body = data.subarray(0, size);
        if (type === "L") longName = field(body, 0, size);
        else if (type === "K") longLink = field(body, 0, size);
        else if (type === "x") pax = new Map([...pax, ...paxRecords(body)]);
        else this.global = new Map([...this.global, ...paxRecords(body)]);
        continue;
      }
      const records = new Map([...this.global, ...pax]);
      const magic = field(block, 257, 6);
      let name = field(block, 0, 100);
      const prefix = magic === "ustar" ? field(block, 345, 155) : "";
      if (prefix) name = `${prefix}/${name}`;
      name = records.get("path") ?? longName ?? name;
      const linkname = records.get("linkpath") ?? longLink ?? field(block, 157, 100);
      if (records.has("size")) size = Number(records.get("size"));
      let mtime = number(block, 136, 12);
      if (records.has("mtime")) mtime = Math.floor(Number(records.get("mtime")));
      if (!Number.isSafeInteger(size) || size < 0) throw archiveError("an entry's size is no number");
      const kinds: Record<string, TarEntry["type"]> = {
        "0": "file",
        "\0": "file",
        "7": "file",
        "1": "link",
        "2": "symlink",
        "5": "directory",
      };
      // Hard links, links, directories and devices carry no content, whatever their size field says.
      const kind = kinds[type] ?? "other";
      const carried = kind === "file" || kind === "other" ? size : 0;
      this.content = carried;
      this.padding = padded(carried) - carried;
      return { name, type: kind, mode: number(block, 100, 8), mtime, size: carried, linkname };
    }
  }

  /** The current entry's content, as it comes. */
  async *body(): AsyncGenerator<Uint8Array> {
    for await (const piece of this.bytes.stream(this.content)) {
      this.content -= piece.length;
      yield piece;
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
  const tar = new TarReader(chunks);
  const directories: [string, number, number][] = [];
  for (let entry = await tar.next(); entry; entry = await tar.next()) {
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
        for await (const piece of tar.body()) {
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
