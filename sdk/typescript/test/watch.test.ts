/** Watching a directory of the workspace (`sb.files.watch`, `attachWatch`), against a real runtime and real
 * sandboxes. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import {
  FailedPrecondition,
  type FileEvent,
  FileWatch,
  InvalidArgument,
  MentisError,
  NotFound,
  OutOfRange,
  Sandbox,
} from "mentis-sandbox";
import { CuttableProxy, runtime } from "./harness.js";
import { refused, sleep, soon } from "./expect.js";

// At the top level: the runtime is stopped after the file's last test.
const rt = await runtime();

/** The events `watch` gives until one of `type` at `path` (all the events read, that one among them). */
async function until(watch: FileWatch, type: string, path: string, timeoutMs = 30_000): Promise<FileEvent[]> {
  const got: FileEvent[] = [];
  const deadline = Date.now() + timeoutMs;
  while (!got.some((e) => e.type === type && e.path === path)) {
    const left = deadline - Date.now();
    assert.ok(left > 0, `no ${type} ${path} within ${timeoutMs} ms; got ${JSON.stringify(seen(got))}`);
    got.push(...(await watch.read({ timeoutMs: left })));
  }
  return got;
}

function seen(events: FileEvent[]): [string, string, boolean][] {
  return events.map((e) => [e.type, e.path, e.isDir]);
}

test("a recursive watch reports what is made, written, moved and removed, in order, each once", async () => {
  await using sb = await Sandbox.create();
  await sb.files.mkdir("rw");
  const started = Date.now();
  let got: FileEvent[];
  {
    await using watch = await sb.files.watch("rw", { recursive: true });
    assert.ok(watch instanceof FileWatch);
    assert.match(watch.watchId, /^watch-/);
    assert.equal(watch.lastSeq, 0);
    await sb.files.mkdir("rw/sub");
    got = await until(watch, "created", "rw/sub");
    await sb.run("echo one > rw/sub/f.txt"); // a directory made later is followed too
    got.push(...(await until(watch, "modified", "rw/sub/f.txt")));
    await sleep(200); // past the 50 ms in which writes to one file are one event
    await sb.run("echo two >> rw/sub/f.txt");
    got.push(...(await until(watch, "modified", "rw/sub/f.txt")));
    await sb.run("rm rw/sub/f.txt");
    got.push(...(await until(watch, "removed", "rw/sub/f.txt")));
    await sb.files.rename("rw/sub", "rw/moved");
    got.push(...(await until(watch, "created", "rw/moved")));
    await sb.run(": > rw/moved/g"); // followed under its new name
    got.push(...(await until(watch, "created", "rw/moved/g")));
    await sb.files.remove("rw/moved", { recursive: true });
    got.push(...(await until(watch, "removed", "rw/moved")));
    await sb.run(": > outside.txt && mkdir -p rwx && : > rwx/f"); // not under the watched directory
    assert.deepEqual(await watch.read({ timeoutMs: 500 }), []);
    assert.equal(watch.lastSeq, 10);
  }
  assert.deepEqual(seen(got), [
    ["created", "rw/sub", true],
    ["created", "rw/sub/f.txt", false],
    ["modified", "rw/sub/f.txt", false],
    ["modified", "rw/sub/f.txt", false],
    ["removed", "rw/sub/f.txt", false],
    ["removed", "rw/sub", true],
    ["created", "rw/moved", true],
    ["created", "rw/moved/g", false],
    ["removed", "rw/moved/g", false],
    ["removed", "rw/moved", true],
  ]);
  assert.deepEqual(
    got.map((e) => e.seq),
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
  );
  assert.ok(got.every((e) => e.missed === 0 && e.time instanceof Date));
  const times = got.map((e) => (e.time as Date).getTime());
  assert.deepEqual(times, [...times].sort((a, b) => a - b));
  assert.ok(times[0] !== undefined && times[0] > started - 5_000);
});

test("a watch without recursive reports only its own directory; for await gives events and loses none", async () => {
  await using sb = await Sandbox.create();
  await sb.run("mkdir -p flat/deep");
  const watch = await sb.files.watch("flat");
  await sb.run(": > flat/deep/inner.txt && mkdir flat/deep/more && : > flat/top.txt && mkdir flat/new");
  await sb.run(": > flat/new/not-followed.txt && rm flat/top.txt");
  const got: FileEvent[] = [];
  for await (const event of watch) {
    got.push(event);
    if (event.type === "removed") break;
  }
  assert.deepEqual(seen(got), [
    ["created", "flat/top.txt", false],
    ["created", "flat/new", true],
    ["removed", "flat/top.txt", false],
  ]);
  // Leaving the loop lost nothing, and closed nothing: the next one goes on from there.
  await sb.run(": > flat/after.txt");
  for await (const event of watch) {
    assert.deepEqual(seen([event]), [["created", "flat/after.txt", false]]);
    break;
  }
  // Closed, the loop ends once what arrived is read.
  await sb.run(": > flat/last.txt");
  await until(watch, "created", "flat/last.txt");
  await watch.close();
  const after: FileEvent[] = [];
  for await (const event of watch) after.push(event);
  assert.deepEqual(after, []);
  assert.deepEqual(await watch.read({ timeoutMs: 100 }), []);

  // The workspace itself, by default.
  await using whole = await sb.files.watch();
  await sb.run(": > top-level.txt && : > flat/below.txt");
  assert.deepEqual(seen(await until(whole, "created", "top-level.txt")), [["created", "top-level.txt", false]]);
});

test("a watch is read again by its id after its last event, here and from another process", async () => {
  await using sb = await Sandbox.create();
  await sb.files.mkdir("rs");
  const watch = await sb.files.watch("rs");
  await sb.run("echo 1 > rs/a");
  const first = await until(watch, "modified", "rs/a");
  await watch.close();
  await watch.close(); // twice: no error
  assert.deepEqual([watch.lastSeq, seen(first)], [2, [["created", "rs/a", false], ["modified", "rs/a", false]]]);

  await sb.run("echo 2 > rs/b && rm rs/a"); // while nobody reads it
  const rest: FileEvent[] = [];
  {
    await using again = await sb.files.attachWatch(watch.watchId, { afterSeq: watch.lastSeq });
    assert.equal(again.watchId, watch.watchId);
    rest.push(...(await until(again, "removed", "rs/a")));
    await sb.run(": > rs/c"); // then live
    rest.push(...(await until(again, "created", "rs/c")));
  }
  assert.deepEqual(
    rest.map((e) => [e.seq, e.type, e.path]),
    [
      [3, "created", "rs/b"],
      [4, "modified", "rs/b"],
      [5, "removed", "rs/a"],
      [6, "created", "rs/c"],
    ],
  );
  // afterSeq 0: every event still kept.
  {
    await using whole = await sb.files.attachWatch(watch.watchId);
    assert.deepEqual(
      (await until(whole, "created", "rs/c")).map((e) => e.seq),
      [1, 2, 3, 4, 5, 6],
    );
  }
  // From another process, knowing the sandbox and the watch id.
  const script = `
    import { Sandbox } from "mentis-sandbox";
    const [id, watchId] = process.argv.slice(1);
    const sb = await Sandbox.connect(id);
    try {
      const w = await sb.files.attachWatch(watchId, { afterSeq: 4 });
      for await (const e of w) {
        console.log(e.seq, e.type, e.path);
        if (e.seq === 6) break;
      }
      await w.close();
    } finally {
      await sb.close();
    }`;
  const out = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", script, sb.id, watch.watchId], {
    cwd: process.cwd(),
    timeout: 120_000,
  });
  assert.equal(out.stdout, "5 removed rs/a\n6 created rs/c\n");
});

test("events a reader fell too far behind for are a gap event", async () => {
  await using sb = await Sandbox.create();
  await sb.files.mkdir("many");
  const watch = await sb.files.watch("many");
  await watch.close();
  // 5000 events while nobody reads: the watch keeps its newest 4096.
  assert.ok((await sb.run("cd many && for i in $(seq 1 5000); do : > f$i; done")).ok);
  let got: FileEvent[];
  {
    await using again = await sb.files.attachWatch(watch.watchId);
    got = await until(again, "created", "many/f5000");
    assert.equal(again.lastSeq, 5000);
  }
  const gap = got[0];
  assert.ok(gap);
  assert.deepEqual([gap.type, gap.seq, gap.missed, gap.path, gap.time], ["gap", 904, 904, "", undefined]);
  assert.deepEqual(
    got.slice(1).map((e) => e.seq),
    Array.from({ length: 4096 }, (_, i) => 905 + i),
  );
  assert.deepEqual(
    got.slice(1, 3).map((e) => e.path),
    ["many/f905", "many/f906"],
  );
  // A reader that resumes after the gap does not get it again.
  await using after = await sb.files.attachWatch(watch.watchId, { afterSeq: 904 });
  assert.equal((await after.read({ timeoutMs: 10_000 }))[0]?.seq, 905);
});

test("a watch stream cut by the network is opened again and every event arrives once", async () => {
  const proxy = await CuttableProxy.start(rt.port);
  try {
    await using sb = await Sandbox.create({ addr: proxy.addr });
    await sb.files.mkdir("net");
    await using direct = await Sandbox.connect(sb.id, { addr: rt.addr }); // not cut
    const got: FileEvent[] = [];
    {
      await using watch = await sb.files.watch("net");
      const writer = await direct.run("for i in $(seq 1 40); do : > net/f$i; sleep 0.03; done", { background: true });
      for await (const event of watch) {
        got.push(event);
        if (proxy.cuts === 0 && event.path === "net/f10") proxy.cut();
        if (event.path === "net/f40") break;
      }
      assert.ok((await writer.wait()).ok);
      // Cut again while nothing comes: it is opened again all the same.
      proxy.cut();
      await sleep(300);
      await direct.run(": > net/late");
      got.push(...(await until(watch, "created", "net/late")));
    }
    assert.equal(proxy.cuts, 2);
    assert.deepEqual(
      got.map((e) => e.path),
      [...Array.from({ length: 40 }, (_, i) => `net/f${i + 1}`), "net/late"],
    );
    assert.deepEqual(
      got.map((e) => e.seq),
      Array.from({ length: 41 }, (_, i) => i + 1),
    );
  } finally {
    await proxy.close();
  }
});

test("onEvent gets the events as they come; close from it, its error, and wait", async () => {
  await using sb = await Sandbox.create();
  await sb.files.mkdir("cb");
  const calls: string[] = [];
  const watch: FileWatch = await sb.files.watch("cb", {
    onEvent: (event) => {
      calls.push(event.path);
      if (event.path === "cb/stop") void watch.close(); // from the callback
    },
  });
  await assert.rejects(watch.wait({ timeoutMs: 200 }), { name: "TimeoutError" });
  await sb.run(": > cb/a && : > cb/stop && : > cb/late");
  await watch.wait({ timeoutMs: 30_000 }); // resolves once the callback closed it
  assert.deepEqual(calls, ["cb/a", "cb/stop"]);
  await refused(watch.read(), MentisError); // its events went to the callback

  const failing = await sb.files.watch("cb", {
    onEvent: (event) => {
      throw new Error(`callback saw ${event.path}`);
    },
  });
  await sb.run(": > cb/b");
  await assert.rejects(failing.wait({ timeoutMs: 30_000 }), /callback saw cb\/b/);
  await failing.close(); // no error

  // An abort ends a wait (the watch goes on).
  await using plain = await sb.files.watch("cb");
  const abort = new AbortController();
  setTimeout(() => abort.abort(new Error("enough")), 100);
  await assert.rejects(plain.read({ signal: abort.signal }), /enough/);
  await sb.run(": > cb/c");
  assert.deepEqual(seen(await until(plain, "created", "cb/c")), [["created", "cb/c", false]]);
});

test("closing the sandbox's connection closes its watches", async () => {
  await using sb = await Sandbox.create();
  await sb.files.mkdir("c");
  const other = await Sandbox.connect(sb.id);
  const followed = await other.files.watch("c");
  await other.close();
  await followed.wait({ timeoutMs: 5_000 });
  assert.deepEqual(await followed.read({ timeoutMs: 100 }), []);
  // The watch itself stays in the sandbox: read again from here.
  await sb.run(": > c/x");
  await using again = await sb.files.attachWatch(followed.watchId);
  assert.deepEqual(seen(await until(again, "created", "c/x")), [["created", "c/x", false]]);
});

test("watch mistakes are typed errors, thrown at once", async () => {
  await using sb = await Sandbox.create();
  await sb.files.write("plain.txt", "x");
  await refused(sb.files.watch("plain.txt"), InvalidArgument);
  await refused(sb.files.watch("no/such/dir"), NotFound, { reason: "PATH_NOT_FOUND" });
  await refused(sb.files.watch("../etc"), InvalidArgument);
  await refused(sb.files.attachWatch("watch-000000000000"), NotFound, { reason: "PATH_NOT_FOUND" });
  await refused(sb.files.attachWatch("not a watch id"), InvalidArgument);
  const watch = await sb.files.watch();
  await watch.close();
  await refused(sb.files.attachWatch(watch.watchId, { afterSeq: 1_000_000 }), OutOfRange, { reason: "SEQ_OUT_OF_RANGE" });
  // Refused here, before any call: an empty id would start a new watch of the whole workspace.
  await refused(sb.files.attachWatch(""), InvalidArgument, { field: "watchId" });
  await refused(sb.files.attachWatch(undefined as unknown as string), InvalidArgument, { field: "watchId" });
  for (const afterSeq of [-1, 1.5, Number.NaN, "3" as unknown as number]) {
    await refused(sb.files.attachWatch(watch.watchId, { afterSeq }), InvalidArgument, { field: "afterSeq" });
  }
  await refused(sb.files.watch("", { recursive: 1 as unknown as boolean }), InvalidArgument, { field: "recursive" });
  await refused(sb.files.watch("", { onEvent: "x" as unknown as () => void }), InvalidArgument, { field: "onEvent" });
  await refused(watch.read({ timeoutMs: Number.NaN }), InvalidArgument, { field: "timeoutMs" });
  await refused(watch.wait({ timeoutMs: -1 }), InvalidArgument, { field: "timeoutMs" });

  // A sandbox keeps at most 16 watches: while each has a reader a 17th is refused; once they are closed, a new
  // one ends the one read least recently.
  await using full = await Sandbox.create();
  const watches: FileWatch[] = [];
  for (let i = 0; i < 16; i++) watches.push(await full.files.watch());
  await refused(full.files.watch(), FailedPrecondition);
  for (const w of watches) {
    await w.close();
    await sleep(50);
  }
  let newest: FileWatch | undefined;
  await soon(async () => {
    try {
      newest = await full.files.watch();
      return true;
    } catch (e) {
      if (e instanceof FailedPrecondition) return false;
      throw e;
    }
  }, "a place for a new watch after closing 16", 15_000, 200);
  await newest?.close();
  await refused(full.files.attachWatch(watches[0]?.watchId ?? ""), NotFound);
  await (await full.files.attachWatch(watches[1]?.watchId ?? "")).close();
});
