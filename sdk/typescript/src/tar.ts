/**
 * A folder as a tar archive (POSIX ustar, with PAX headers for long names), made as it is read: what
 * `Templates.buildImage` sends as a build context. As the Python SDK's: names relative to the folder, sorted, a
 * folder before what it holds; symbolic links as links, a file's further hard links as links to the first;
 * sockets, fifos and devices left out.
 */
import { lstat, open, readdir, readlink } from "node:fs/promises";
import { join } from "node:path";

const BLOCK = 512;

/** The pieces of `source` in chunks of about `size` bytes (small pieces gathered, large ones as they are). */
export async function* rechunk(source: AsyncIterable<Uint8Array> | Iterable<Uint8Array>, size: number): AsyncGenerator<Uint8Array> {
  let parts: Uint8Array[] = [];
  let held = 0;
  for await (const piece of source) {
    if (!held && piece.length >= size) {
      yield piece;
      continue;
    }
    parts.push(piece);
    held += piece.length;
    if (held >= size) {
      yield Buffer.concat(parts);
      parts = [];
      held = 0;
    }
  }
  if (held) yield Buffer.concat(parts);
}

function octal(value: number, width: number): string {
  return value.toString(8).padStart(width - 1, "0") + "\0";
}

/** One PAX record, `"<length> <key>=<value>\n"`, its length counting itself. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const bodyLength = Buffer.byteLength(body);
  let length = bodyLength + 1;
  while (String(length).length + bodyLength !== length) length = String(length).length + bodyLength;
  return `${length}${body}`;
}

interface Entry {
  name: string;
  type: "0" | "1" | "2" | "5" | "x";
  mode: number;
  size: number;
  mtime: number;
  linkname: string;
}

function header(e: Entry): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(e.name, 0, 100, "utf8");
  h.write(octal(e.mode & 0o7777, 8), 100, "ascii");
  h.write(octal(0, 8), 108, "ascii");
  h.write(octal(0, 8), 116, "ascii");
  h.write(octal(e.size, 12), 124, "ascii");
  h.write(octal(Math.max(0, Math.floor(e.mtime)), 12), 136, "ascii");
  h.write("        ", 148, "ascii");
  h.write(e.type, 156, "ascii");
  h.write(e.linkname, 157, 100, "utf8");
  h.write("ustar\0", 257, "ascii");
  h.write("00", 263, "ascii");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + " ", 148, "ascii");
  return h;
}

const padding = (size: number) => Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK);

/** The header blocks of `e`: a PAX header first when the name, the link or the size does not fit ustar's. */
function headers(e: Entry): Buffer[] {
  const records: string[] = [];
  if (Buffer.byteLength(e.name) > 100 || /[^\x20-\x7e]/.test(e.name)) records.push(paxRecord("path", e.name));
  if (Buffer.byteLength(e.linkname) > 100 || /[^\x20-\x7e]/.test(e.linkname)) records.push(paxRecord("linkpath", e.linkname));
  if (e.size > 0o77777777777) records.push(paxRecord("size", String(e.size)));
  const own = header({
    ...e,
    name: records.length ? Buffer.from(e.name).subarray(0, 100).toString("latin1").replace(/[^\x20-\x7e]/g, "_") : e.name,
    linkname: records.length ? e.linkname.slice(0, 100).replace(/[^\x20-\x7e]/g, "_") : e.linkname,
    size: e.size > 0o77777777777 ? 0 : e.size,
  });
  if (!records.length) return [own];
  const pax = Buffer.from(records.join(""));
  const paxHeader = header({ name: "././@PaxHeader", type: "x", mode: 0o644, size: pax.length, mtime: e.mtime, linkname: "" });
  return [paxHeader, pax, padding(pax.length), own];
}

async function* walk(dir: string, prefix: string): AsyncGenerator<[string, string]> {
  const names = (await readdir(dir)).sort();
  for (const name of names) {
    const path = join(dir, name);
    yield [path, prefix + name];
    if ((await lstat(path)).isDirectory()) yield* walk(path, `${prefix}${name}/`);
  }
}

/** The tar archive of folder `root`'s contents, in pieces (headers, file data in `chunk`-byte reads). */
export async function* tarFolder(root: string, chunk: number): AsyncGenerator<Uint8Array> {
  const seen = new Map<string, string>();
  for await (const [path, name] of walk(root, "")) {
    const st = await lstat(path);
    const mtime = st.mtimeMs / 1000;
    if (st.isDirectory()) {
      yield* headers({ name: `${name}/`, type: "5", mode: st.mode, size: 0, mtime, linkname: "" });
    } else if (st.isSymbolicLink()) {
      yield* headers({ name, type: "2", mode: st.mode, size: 0, mtime, linkname: await readlink(path) });
    } else if (st.isFile()) {
      const inode = `${st.dev}:${st.ino}`;
      const first = st.nlink > 1 ? seen.get(inode) : undefined;
      if (first !== undefined) {
        yield* headers({ name, type: "1", mode: st.mode, size: 0, mtime, linkname: first });
        continue;
      }
      if (st.nlink > 1) seen.set(inode, name);
      yield* headers({ name, type: "0", mode: st.mode, size: st.size, mtime, linkname: "" });
      const file = await open(path, "r");
      try {
        let left = st.size;
        while (left > 0) {
          const buffer = Buffer.alloc(Math.min(chunk, left));
          const { bytesRead } = await file.read(buffer, 0, buffer.length, null);
          if (!bytesRead) throw new Error(`${path} shrank while it was being sent`);
          left -= bytesRead;
          yield buffer.subarray(0, bytesRead);
        }
      } finally {
        await file.close();
      }
      yield padding(st.size);
    }
    // Sockets, fifos and devices: nothing a build context needs.
  }
  yield Buffer.alloc(2 * BLOCK);
}
