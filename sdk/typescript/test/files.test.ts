/** The sandbox's files (`sb.files`): reads, writes, listings, directories, renames, edits, and copies of files
 * and trees both ways, against a real runtime and real sandboxes. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { chmod, link, lstat, mkdir, mkdtemp, readdir, readFile, readlink, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { execFileSync } from "node:child_process";
import {
  AlreadyExists,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  Sandbox,
  type FileInfo,
} from "mentis-sandbox";
import { runtime } from "./harness.js";
import { refused, soon } from "./expect.js";

// At the top level: the runtime is stopped after the file's last test (`after` inside a test would stop it at
// that test's end).
await runtime();

/** Every byte value, `times` over. */
function everyByte(times: number): Uint8Array {
  const out = new Uint8Array(256 * times);
  for (let i = 0; i < out.length; i++) out[i] = i % 256;
  return out;
}

const sha256 = (data: Uint8Array) => createHash("sha256").update(data).digest("hex");

async function localTmp(t: { after: (fn: () => Promise<void>) => void }): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "mentis-ts-files-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

test("text and bytes go both ways whole: every byte value, more than a chunk, streamed, piped, in part", async (t) => {
  await using sb = await Sandbox.create();
  const tmp = await localTmp(t);

  const written = await sb.files.write("dir/a.txt", "héllo\n");
  assert.deepEqual([written.path, written.size, written.isDir, written.mode], ["dir/a.txt", 7, false, 0o644]);
  assert.equal(await sb.files.readText("dir/a.txt"), "héllo\n");
  assert.equal((await sb.run("cat dir/a.txt")).stdout, "héllo\n");

  // 1.28 MB: more than one 1 MiB message up, several 256 KiB pieces down.
  const data = everyByte(5000);
  assert.equal((await sb.files.write("dir/b.bin", data)).size, data.length);
  assert.equal(sha256(await sb.files.read("dir/b.bin")), sha256(data));
  assert.equal((await sb.run("sha256sum < dir/b.bin")).stdout.split(" ")[0], sha256(data));
  let pieces = 0;
  let total = 0;
  for await (const piece of sb.files.readStream("dir/b.bin")) {
    assert.ok(piece instanceof Uint8Array && piece.length <= 256 * 1024);
    pieces++;
    total += piece.length;
  }
  assert.ok(pieces > 1, `${pieces} piece(s)`);
  assert.equal(total, data.length);

  // A stream a user can pipe: to a local file, through a Readable.
  await pipeline(sb.files.readStream("dir/b.bin"), createWriteStream(join(tmp, "b.bin")));
  assert.equal(sha256(await readFile(join(tmp, "b.bin"))), sha256(data));
  const chunks: Buffer[] = [];
  for await (const c of Readable.from(sb.files.readStream("dir/a.txt"))) chunks.push(c as Buffer);
  assert.equal(Buffer.concat(chunks).toString(), "héllo\n");

  // Part of a file: from an offset, a length.
  assert.deepEqual([...(await sb.files.read("dir/b.bin", { offset: 255, length: 3 }))], [255, 0, 1]);
  assert.equal((await sb.files.read("dir/b.bin", { offset: data.length + 10 })).length, 0);
  // Leaving the loop early ends the read.
  for await (const piece of sb.files.readStream("dir/b.bin")) {
    assert.ok(piece.length > 0);
    break;
  }

  // Written from a stream (a Node Readable of a local file; an async generator of text and bytes), with a mode.
  await writeFile(join(tmp, "local.bin"), data);
  await sb.files.write("dir/from-stream.bin", createReadStream(join(tmp, "local.bin"), { highWaterMark: 300_000 }));
  assert.equal(sha256(await sb.files.read("dir/from-stream.bin")), sha256(data));
  async function* parts() {
    yield "#!/bin/sh\n";
    yield new TextEncoder().encode("echo run\n");
  }
  const script = await sb.files.write("dir/run.sh", parts(), { mode: 0o750 });
  assert.equal(script.mode, 0o750);
  assert.equal((await sb.run("./dir/run.sh")).stdout, "run\n");
  // An empty file.
  assert.equal((await sb.files.write("dir/empty", "")).size, 0);
  assert.equal((await sb.files.read("dir/empty")).length, 0);

  // A file that is not there; a path out of the workspace.
  await refused(sb.files.read("dir/missing"), NotFound, { reason: "PATH_NOT_FOUND" });
  await refused(sb.files.readText("../etc/passwd"), InvalidArgument);
  await refused(sb.files.write("../outside.txt", "x"), InvalidArgument);
});

test("listing gives every entry across pages; stat and exists describe one", async () => {
  await using sb = await Sandbox.create();
  await sb.run("mkdir -p l/sub && for i in 1 2 3 4 5; do echo $i > l/f$i; done && echo deep > l/sub/d && ln -s f1 l/link");

  const first = await sb.files.listPage("l", { pageSize: 2 });
  assert.deepEqual(first.files.map((f) => f.path), ["l/f1", "l/f2"]);
  assert.ok(first.nextPageToken && first.truncated);
  const second = await sb.files.listPage("l", { pageSize: 2, pageToken: first.nextPageToken });
  assert.deepEqual(second.files.map((f) => f.path), ["l/f3", "l/f4"]);
  const flat = await sb.files.list("l", { pageSize: 2 });
  assert.deepEqual(flat.map((f) => f.path), ["l/f1", "l/f2", "l/f3", "l/f4", "l/f5", "l/link", "l/sub"]);
  const deep = await sb.files.list("l", { recursive: true, pageSize: 3 });
  assert.deepEqual(deep.map((f) => f.path), ["l/f1", "l/f2", "l/f3", "l/f4", "l/f5", "l/link", "l/sub", "l/sub/d"]);
  const byPath = new Map<string, FileInfo>(deep.map((f) => [f.path, f]));
  assert.deepEqual(pick(byPath.get("l/sub")), { name: "sub", type: "directory", isDir: true });
  assert.deepEqual(pick(byPath.get("l/f3")), { name: "f3", type: "file", isDir: false });
  assert.equal(byPath.get("l/f3")?.size, 2);
  assert.equal(byPath.get("l/link")?.type, "symlink");
  assert.equal(byPath.get("l/link")?.symlinkTarget, "f1");
  // A token of another listing is refused.
  await refused(sb.files.listPage("l/sub", { pageSize: 2, pageToken: first.nextPageToken }), InvalidArgument);

  const before = Date.now();
  await sb.files.write("l/f1", "changed");
  const f1 = await sb.files.stat("l/f1");
  assert.deepEqual([f1.path, f1.name, f1.size, f1.mode, f1.isDir], ["l/f1", "f1", 7, 0o644, false]);
  assert.ok(f1.modifiedAt && Math.abs(f1.modifiedAt.getTime() - before) < 60_000, String(f1.modifiedAt));
  assert.equal((await sb.files.stat("l")).isDir, true);
  assert.equal((await sb.files.stat("l/link")).type, "symlink"); // described, not followed
  assert.equal((await sb.files.stat("")).isDir, true); // the workspace
  assert.equal(await sb.files.exists("l/f1"), true);
  assert.equal(await sb.files.exists("l/nothing"), false);
  await refused(sb.files.stat("l/nothing"), NotFound, { reason: "PATH_NOT_FOUND" });
  await refused(sb.files.exists("../etc"), InvalidArgument);
});

function pick(f: FileInfo | undefined) {
  assert.ok(f);
  return { name: f.name, type: f.type, isDir: f.isDir };
}

test("directories are made with their parents; files, links and trees removed; refusals are typed", async () => {
  await using sb = await Sandbox.create();
  const made = await sb.files.mkdir("made/deep/er", { mode: 0o750 });
  assert.deepEqual([made.path, made.isDir, made.mode], ["made/deep/er", true, 0o750]);
  assert.deepEqual((await sb.run("stat -c %a made made/deep made/deep/er")).stdout.split(/\s+/).filter(Boolean), [
    "750",
    "750",
    "750",
  ]);
  assert.equal((await sb.files.mkdir("made/deep/er")).isDir, true); // an existing directory is no error
  await sb.files.write("made/deep/f.txt", "x");
  await refused(sb.files.mkdir("made/deep/f.txt"), InvalidArgument); // a file is there
  await sb.files.remove("made/deep/f.txt");
  await refused(sb.files.stat("made/deep/f.txt"), NotFound);
  await refused(sb.files.remove("made"), FailedPrecondition); // not empty, and not recursive
  assert.equal((await sb.files.stat("made/deep/er")).isDir, true); // nothing went
  await sb.files.remove("made", { recursive: true });
  await refused(sb.files.stat("made"), NotFound);
  await refused(sb.files.remove("made"), NotFound, { reason: "PATH_NOT_FOUND" });
  // An empty directory goes without `recursive`; a link goes, not what it points to.
  await sb.run("mkdir empty && echo kept > target.txt && ln -s target.txt link");
  await sb.files.remove("empty");
  await sb.files.remove("link");
  assert.equal((await sb.run("ls -d empty link 2>/dev/null; cat target.txt")).stdout, "kept\n");
  await refused(sb.files.remove("../etc", { recursive: true }), InvalidArgument);
  await refused(sb.files.mkdir("../outside"), InvalidArgument);

  // Mistakes a JavaScript caller can make are refused here, naming the argument; nothing is sent.
  await refused(sb.files.remove(undefined as unknown as string, { recursive: true }), InvalidArgument, { field: "path" });
  await refused(sb.files.remove("target.txt", { recursive: "yes" as unknown as boolean }), InvalidArgument, {
    field: "recursive",
  });
  await refused(sb.files.mkdir("m", { mode: -1 }), InvalidArgument, { field: "mode" });
  await refused(sb.files.mkdir("m", { mode: 1.5 }), InvalidArgument, { field: "mode" });
  await refused(sb.files.read("target.txt", { offset: -1 }), InvalidArgument, { field: "offset" });
  await refused(sb.files.read("target.txt", { length: 0.5 }), InvalidArgument, { field: "length" });
  await refused(sb.files.write("w.txt", 42 as unknown as string), InvalidArgument, { field: "data" });
  await refused(sb.files.write("w.txt", "x", { mode: 2 ** 33 }), InvalidArgument, { field: "mode" });
  await refused(sb.files.stat(null as unknown as string), InvalidArgument, { field: "path" });
  await refused(sb.files.list("", { pageSize: -2 }), InvalidArgument, { field: "pageSize" });
  assert.equal(await sb.files.exists("m"), false);
  assert.equal(await sb.files.exists("w.txt"), false);
  assert.equal(await sb.files.readText("target.txt"), "kept\n");
});

test("rename moves files, links and directories in one step and replaces only when asked", async () => {
  await using sb = await Sandbox.create();
  await sb.run("mkdir -p mv/dir/inner mv/empty mv/full && echo a > mv/a.txt && echo b > mv/b.txt");
  await sb.run("ln -s a.txt mv/link && touch mv/full/kept");
  const moved = await sb.files.rename("mv/a.txt", "mv/dir/renamed.txt");
  assert.deepEqual([moved.path, moved.isDir, moved.size], ["mv/dir/renamed.txt", false, 2]);
  assert.equal(await sb.files.readText("mv/dir/renamed.txt"), "a\n");
  await refused(sb.files.stat("mv/a.txt"), NotFound);

  // Something at the destination: refused, typed, and both left as they were; replaced with `overwrite`.
  await refused(sb.files.rename("mv/b.txt", "mv/dir/renamed.txt"), AlreadyExists, { reason: "PATH_EXISTS" });
  assert.deepEqual([await sb.files.readText("mv/b.txt"), await sb.files.readText("mv/dir/renamed.txt")], ["b\n", "a\n"]);
  assert.equal((await sb.files.rename("mv/b.txt", "mv/dir/renamed.txt", { overwrite: true })).path, "mv/dir/renamed.txt");
  assert.equal(await sb.files.readText("mv/dir/renamed.txt"), "b\n");
  assert.deepEqual((await sb.run("ls mv")).stdout.split(/\s+/).filter(Boolean), ["dir", "empty", "full", "link"]);

  // A link moves as a link; a directory with everything in it.
  const link2 = await sb.files.rename("mv/link", "mv/link2");
  assert.deepEqual([link2.path, link2.symlinkTarget], ["mv/link2", "a.txt"]);
  const tree = await sb.files.rename("mv/dir", "mv/tree");
  assert.deepEqual([tree.path, tree.isDir], ["mv/tree", true]);
  assert.equal(await sb.files.readText("mv/tree/renamed.txt"), "b\n");
  assert.equal((await sb.files.stat("mv/tree/inner")).isDir, true);
  // A directory replaces only an empty one, and only with `overwrite`; it never goes into itself.
  await refused(sb.files.rename("mv/tree", "mv/empty"), AlreadyExists);
  await refused(sb.files.rename("mv/tree", "mv/full", { overwrite: true }), FailedPrecondition);
  await refused(sb.files.rename("mv/tree", "mv/tree/inner/self"), InvalidArgument);
  assert.equal((await sb.files.rename("mv/tree", "mv/empty", { overwrite: true })).isDir, true);
  assert.equal(await sb.files.readText("mv/empty/renamed.txt"), "b\n");

  await refused(sb.files.rename("mv/nothing", "mv/x"), NotFound, { reason: "PATH_NOT_FOUND" });
  await refused(sb.files.rename("mv/full/kept", "mv/no/such/dir/kept"), NotFound); // the parent must exist
  await refused(sb.files.rename("mv/full/kept", "../outside"), InvalidArgument);
  await refused(sb.files.rename("mv/full/kept", 7 as unknown as string), InvalidArgument, { field: "destination" });
  // What was refused changed nothing.
  const listing = (await sb.run("cd mv && find . -mindepth 1 | sort")).stdout.split("\n").filter(Boolean);
  assert.deepEqual(listing, ["./empty", "./empty/inner", "./empty/renamed.txt", "./full", "./full/kept", "./link2"]);
});

test("edit replaces one exact string, or each with replaceAll, and refuses what is ambiguous or absent", async () => {
  await using sb = await Sandbox.create();
  await sb.files.write("e.py", "x = 1\ny = 1\nprint('x')\n", { mode: 0o750 });
  const one = await sb.files.edit("e.py", "x = 1", "x = 2");
  assert.equal(one.replacements, 1);
  assert.deepEqual([one.file.path, one.file.mode], ["e.py", 0o750]);
  assert.equal(await sb.files.readText("e.py"), "x = 2\ny = 1\nprint('x')\n");

  // Twice without replaceAll, or not at all: refused, and the file left as it was.
  await refused(sb.files.edit("e.py", "= ", "== "), FailedPrecondition);
  await refused(sb.files.edit("e.py", "absent", "x"), FailedPrecondition);
  assert.equal(await sb.files.readText("e.py"), "x = 2\ny = 1\nprint('x')\n");
  const all = await sb.files.edit("e.py", "= ", "== ", { replaceAll: true });
  assert.equal(all.replacements, 2);
  assert.equal(all.file.size, "x == 2\ny == 1\nprint('x')\n".length);
  assert.equal(await sb.files.readText("e.py"), "x == 2\ny == 1\nprint('x')\n");
  const multi = await sb.files.edit("e.py", "y == 1\nprint('x')", "print('é')");
  assert.equal(multi.replacements, 1);
  assert.equal(await sb.files.readText("e.py"), "x == 2\nprint('é')\n");

  await refused(sb.files.edit("e.py", "", "x"), InvalidArgument);
  await refused(sb.files.edit("missing.py", "a", "b"), NotFound, { reason: "PATH_NOT_FOUND" });
  await refused(sb.files.edit("e.py", "x", undefined as unknown as string), InvalidArgument, { field: "newString" });
});

// --- copies of trees and files

/** A tree with what a copy has to keep: modes, an empty directory, a file over the SDK's 1 MiB chunk, an empty
 * file, a symbolic link, a hard link, a non-ASCII name and a name longer than tar's 100 bytes. */
async function makeTree(root: string): Promise<void> {
  await mkdir(join(root, "bin"), { recursive: true });
  await writeFile(join(root, "a.txt"), "alpha\n");
  await writeFile(join(root, "bin", "run.sh"), "#!/bin/sh\necho run\n");
  await chmod(join(root, "bin", "run.sh"), 0o751);
  await writeFile(join(root, "secret"), "s");
  await chmod(join(root, "secret"), 0o600);
  await mkdir(join(root, "empty"));
  await chmod(join(root, "empty"), 0o700);
  const deep = join(root, "deep", "x", "y");
  await mkdir(deep, { recursive: true });
  await writeFile(join(deep, "big.bin"), randomBytes(2_500_000));
  await writeFile(join(deep, "zero"), "");
  await symlink("a.txt", join(root, "link"));
  await link(join(root, "a.txt"), join(root, "hard"));
  await writeFile(join(root, "café.txt"), "crème\n");
  await writeFile(join(root, `long-${"n".repeat(120)}.txt`), "long\n");
}

type Entry = ["dir", number] | ["file", number, string] | ["link", string];

/** Every entry under `root`, by path: its kind, mode, content's sha256 or link target. */
async function localTree(root: string, prefix = ""): Promise<Record<string, Entry>> {
  const tree: Record<string, Entry> = {};
  for (const name of await readdir(join(root, prefix))) {
    const rel = prefix ? `${prefix}/${name}` : name;
    const path = join(root, rel);
    const st = await lstat(path);
    if (st.isSymbolicLink()) tree[rel] = ["link", await readlink(path)];
    else if (st.isDirectory()) {
      tree[rel] = ["dir", st.mode & 0o7777];
      Object.assign(tree, await localTree(root, rel));
    } else tree[rel] = ["file", st.mode & 0o7777, sha256(await readFile(path))];
  }
  return tree;
}

/** The same, as the sandbox's own find and sha256sum see it (not through the SDK's download). */
async function remoteTree(sb: Sandbox, root: string): Promise<Record<string, Entry>> {
  const listing = await sb.run(`cd ${root} && find . -mindepth 1 -printf '%P\\t%y\\t%m\\t%l\\n'`);
  const sums = await sb.run(`cd ${root} && find . -type f -exec sha256sum {} +`);
  assert.ok(listing.ok && sums.ok, listing.stderr + sums.stderr);
  const digest = new Map<string, string>();
  for (const line of sums.stdout.split("\n").filter(Boolean)) {
    const [value, path] = [line.slice(0, 64), line.slice(66)];
    digest.set(path.replace(/^\.\//, ""), value);
  }
  const tree: Record<string, Entry> = {};
  for (const line of listing.stdout.split("\n").filter(Boolean)) {
    const [path = "", kind, mode = "0", target = ""] = line.split("\t");
    if (kind === "l") tree[path] = ["link", target];
    else if (kind === "d") tree[path] = ["dir", parseInt(mode, 8)];
    else tree[path] = ["file", parseInt(mode, 8), digest.get(path) ?? "?"];
  }
  return tree;
}

const sorted = (tree: Record<string, Entry>) => Object.fromEntries(Object.entries(tree).sort(([a], [b]) => (a < b ? -1 : 1)));

test("a directory tree goes up and comes back with contents, modes and links", async (t) => {
  await using sb = await Sandbox.create();
  const tmp = await localTmp(t);
  const src = join(tmp, "src");
  await makeTree(src);
  const local = sorted(await localTree(src));
  assert.equal(Object.keys(local).length, 14);

  // Up: a missing destination becomes the directory; an existing one gets it inside, like cp -r.
  assert.equal(await sb.files.upload(src, "up"), "up");
  assert.deepEqual(sorted(await remoteTree(sb, "up")), local);
  const inodes = (await sb.run("stat -c %i up/a.txt up/hard")).stdout.split(/\s+/).filter(Boolean);
  assert.ok(inodes.length === 2 && inodes[0] === inodes[1], "the hard link was not kept");
  assert.equal(await sb.files.upload(src, "up"), "up/src");
  assert.deepEqual(sorted(await remoteTree(sb, "up/src")), local);
  // Into the workspace ("") under its own name.
  assert.equal(await sb.files.upload(src), "src");
  assert.deepEqual(sorted(await remoteTree(sb, "src")), local);

  // Down: the same two ways.
  const down = join(tmp, "down");
  assert.equal(await sb.files.download("up/src", down), down);
  assert.deepEqual(sorted(await localTree(down)), local);
  assert.equal(await sb.files.download("up/src", down), join(down, "src"));
  assert.deepEqual(sorted(await localTree(join(down, "src"))), local);
  // A download over an older copy replaces what changed and keeps the rest.
  await sb.run("echo changed > up/src/a.txt && rm up/src/secret");
  await writeFile(join(down, "mine.txt"), "local only");
  await sb.files.download("up/src", down);
  assert.equal(await readFile(join(down, "src", "a.txt"), "utf8"), "changed\n");
  assert.ok((await stat(join(down, "src", "secret"))).isFile());
  assert.equal(await readFile(join(down, "mine.txt"), "utf8"), "local only");
  // Modification times come too; set-id bits do not.
  await sb.run("touch -d @1700000000 up/src/bin && chmod 4755 up/src/bin/run.sh || true");
  const again = await sb.files.download("up/src", join(tmp, "again"));
  assert.equal(Math.floor((await stat(join(again, "bin"))).mtimeMs / 1000), 1700000000);
  assert.equal((await stat(join(again, "bin", "run.sh"))).mode & 0o7000, 0);
  // An empty directory.
  await sb.files.mkdir("hollow");
  assert.deepEqual(await readdir(await sb.files.download("hollow", join(tmp, "hollow"))), []);
});

test("long paths and long link targets go up and come back whole (PAX up, GNU long names down)", async (t) => {
  await using sb = await Sandbox.create();
  const tmp = await localTmp(t);
  const src = join(tmp, "src");
  // A path over ustar's 100 bytes that its prefix field could hold (it goes in a PAX header all the same, as
  // Python's tarfile writes it), non-ASCII folders, and links whose targets are over 100 bytes.
  const deep = join("d".repeat(60), `é-${"e".repeat(60)}`);
  await mkdir(join(src, deep), { recursive: true });
  await writeFile(join(src, deep, `f-${"f".repeat(40)}.txt`), "deep\n");
  await chmod(join(src, deep, `f-${"f".repeat(40)}.txt`), 0o640);
  await symlink(join(deep, `f-${"f".repeat(40)}.txt`), join(src, "to-deep"));
  await symlink(join("..", "..", "to-deep"), join(src, deep, `back-${"b".repeat(100)}`));
  const local = sorted(await localTree(src));
  assert.equal(Object.keys(local).length, 5);

  assert.equal(await sb.files.upload(src, "up"), "up");
  assert.deepEqual(sorted(await remoteTree(sb, "up")), local);
  assert.equal((await sb.run(`cat up/to-deep up/${deep}/back-${"b".repeat(100)}`)).stdout, "deep\ndeep\n");
  const down = await sb.files.download("up", join(tmp, "down"));
  assert.deepEqual(sorted(await localTree(down)), local);
  assert.equal(await readFile(join(down, "to-deep"), "utf8"), "deep\n");
});

test("a single file goes as a file and keeps its mode both ways", async (t) => {
  await using sb = await Sandbox.create();
  const tmp = await localTmp(t);
  const data = randomBytes(1_300_000);
  const local = join(tmp, "tool.bin");
  await writeFile(local, data);
  await chmod(local, 0o751);

  // Into a directory ("" is the workspace, a trailing slash or an existing directory): under its own name.
  assert.equal(await sb.files.upload(local, ""), "tool.bin");
  assert.equal(await sb.files.upload(local, "single/"), "single/tool.bin");
  assert.equal(await sb.files.upload(local, "single"), "single/tool.bin");
  // Anywhere else: that path, parent directories made.
  assert.equal(await sb.files.upload(local, "single/sub/renamed.bin"), "single/sub/renamed.bin");
  for (const path of ["tool.bin", "single/tool.bin", "single/sub/renamed.bin"]) {
    assert.equal(sha256(await sb.files.read(path)), sha256(data), path);
    assert.equal((await sb.files.stat(path)).mode, 0o751, path);
  }

  await sb.run("chmod 640 single/sub/renamed.bin && touch -d @1700000000 single/sub/renamed.bin");
  const got = join(tmp, "got", "copy.bin"); // its folder is made
  assert.equal(await sb.files.download("single/sub/renamed.bin", got), got);
  assert.equal(sha256(await readFile(got)), sha256(data));
  assert.equal((await stat(got)).mode & 0o7777, 0o640);
  assert.equal(Math.floor((await stat(got)).mtimeMs / 1000), 1700000000);
  // Into an existing local directory: under its own name, replacing an older file whole.
  await writeFile(join(tmp, "got", "renamed.bin"), "old");
  assert.equal(await sb.files.download("single/sub/renamed.bin", join(tmp, "got")), join(tmp, "got", "renamed.bin"));
  assert.equal(sha256(await readFile(join(tmp, "got", "renamed.bin"))), sha256(data));
  assert.deepEqual((await readdir(join(tmp, "got"))).sort(), ["copy.bin", "renamed.bin"]); // no staging left
  // A link comes as a link.
  await sb.run("ln -s tool.bin tool-link");
  const linked = await sb.files.download("tool-link", join(tmp, "linked"));
  assert.equal(await readlink(linked), "tool.bin");
  // A mode with set-id bits goes without them (the runtime refuses them).
  await chmod(local, 0o4755);
  assert.equal(await sb.files.upload(local, "setid.bin"), "setid.bin");
  assert.equal((await sb.files.stat("setid.bin")).mode, 0o755);
});

test("copy mistakes are typed errors and change nothing", async (t) => {
  await using sb = await Sandbox.create();
  const tmp = await localTmp(t);
  await refused(sb.files.download("no/such/thing", join(tmp, "x")), NotFound, { reason: "PATH_NOT_FOUND" });
  await assert.rejects(stat(join(tmp, "x")), { code: "ENOENT" });
  await refused(sb.files.download("../etc", tmp), InvalidArgument);
  await assert.rejects(sb.files.upload(join(tmp, "absent"), ""), { code: "ENOENT" });
  execFileSync("mkfifo", [join(tmp, "fifo")]);
  await refused(sb.files.upload(join(tmp, "fifo"), ""), InvalidArgument, { field: "localPath" });
  await writeFile(join(tmp, "f"), "f");
  await refused(sb.files.upload(join(tmp, "f"), "../outside.txt"), InvalidArgument);
  await refused(sb.files.upload(join(tmp, "f"), 3 as unknown as string), InvalidArgument, { field: "remotePath" });
  // A link out of the directory refuses the whole upload: nothing lands.
  const bad = join(tmp, "bad");
  await mkdir(bad);
  await writeFile(join(bad, "fine.txt"), "fine");
  await symlink("/etc/passwd", join(bad, "escape"));
  await refused(sb.files.upload(bad, "refused"), InvalidArgument);
  await refused(sb.files.stat("refused"), NotFound);
  // A fifo in a tree is a special file: the runtime refuses the whole upload.
  const special = join(tmp, "special");
  await mkdir(special);
  await writeFile(join(special, "fine.txt"), "fine");
  execFileSync("mkfifo", [join(special, "pipe")]);
  await refused(sb.files.upload(special, "special"), InvalidArgument);
  await refused(sb.files.stat("special"), NotFound);
});

test("a write whose data fails midway is cancelled: its error is thrown and the old file stays", async () => {
  await using sb = await Sandbox.create();
  await sb.files.write("kept.txt", "old");
  async function* failing() {
    yield new TextEncoder().encode("new content");
    await new Promise((r) => setTimeout(r, 100));
    throw new Error("the local disk went away");
  }
  await assert.rejects(sb.files.write("kept.txt", failing()), /the local disk went away/);
  assert.equal(await sb.files.readText("kept.txt"), "old");
  await assert.rejects(sb.files.write("fresh.txt", failing()), /the local disk went away/);
  assert.equal(await sb.files.exists("fresh.txt"), false);

  // An abort does the same, and rejects with the signal's reason.
  const abort = new AbortController();
  async function* slow() {
    yield new TextEncoder().encode("partial");
    abort.abort(new Error("stop now"));
    await new Promise((r) => setTimeout(r, 5_000));
  }
  await assert.rejects(sb.files.write("kept.txt", slow(), { signal: abort.signal }), /stop now/);
  assert.equal(await sb.files.readText("kept.txt"), "old");
  const aborted = new AbortController();
  aborted.abort(new Error("before"));
  await assert.rejects(sb.files.read("kept.txt", { signal: aborted.signal }), /before/);
  await soon(async () => !(await sb.files.exists("fresh.txt")), "no fresh.txt");
});
