import { test } from "node:test";
import assert from "node:assert/strict";
import {
  DeadlineExceeded,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  Sandbox,
  type Terminal,
  TerminalEnded,
  type TerminalInfo,
} from "mentis-sandbox";
import { CuttableProxy, runtime } from "./harness.js";

const text = (data: Uint8Array) => new TextDecoder().decode(data);

/** The terminal as ListTerminals shows it once `ready` (the runtime sees a stream go a moment later). */
async function listedWhen(sb: Sandbox, id: string, ready: (t: TerminalInfo) => boolean): Promise<TerminalInfo> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const listed = (await sb.terminals.list()).find((t) => t.id === id);
    assert.ok(listed, `terminal ${id} is not listed`);
    if (ready(listed) || Date.now() > deadline) return listed;
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function all(term: Terminal): Promise<string> {
  const chunks: Uint8Array[] = [];
  for await (const chunk of term) chunks.push(chunk);
  return text(Buffer.concat(chunks));
}

test("a terminal runs bash: input, output, resize, listing and its exit code", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  let id: string;
  {
    await using term = await sb.terminals.open({ rows: 24, cols: 80 });
    id = term.id;
    assert.deepEqual([term.rows, term.cols], [24, 80]);
    await term.write("echo hi-$((6 * 7))\n"); // the echo of what was typed has no "hi-42"
    assert.match(text(await term.readUntil("hi-42")), /hi-42$/);
    await term.write(new TextEncoder().encode("stty size\n"));
    await term.readUntil("24 80");
    await term.resize(40, 123);
    assert.deepEqual([term.rows, term.cols], [40, 123]);
    await term.write("stty size\n");
    await term.readUntil("40 123");
    const listed = (await sb.terminals.list()).find((t) => t.id === term.id);
    assert.ok(listed);
    assert.deepEqual([listed.rows, listed.cols, listed.attached, listed.exitCode], [40, 123, 1, undefined]);
    assert.deepEqual(listed.command, ["/bin/bash", "-l"]);
    assert.ok(listed.pid > 0 && listed.createdAt instanceof Date && listed.lastSeq > 0n);
    assert.equal(term.exitCode, undefined);
    await term.write("exit 3\n");
    assert.equal(await term.wait({ timeoutMs: 30_000 }), 3);
    assert.deepEqual([term.exitCode, term.signal], [3, 0]);
  }
  // The block closed it: the sandbox forgot it.
  assert.ok(!(await sb.terminals.list()).some((t) => t.id === id));
});

test("output is iterated or called back, env and cwd apply, and signals reach the program", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const term = await sb.terminals.open({ command: ["sh", "-c", "printf 'one\\ntwo\\n'; exit 2"] });
  assert.equal(await all(term), "one\r\ntwo\r\n"); // the terminal turns \n into \r\n
  assert.equal(await term.wait(), 2);
  await term.close();

  const seen: Uint8Array[] = [];
  {
    await using t = await sb.terminals.open({
      command: ["sh", "-c", "echo $X $(pwd)"],
      env: { X: "env-ok" },
      cwd: "/tmp",
      onOutput: (data) => seen.push(data),
    });
    assert.equal(await t.wait({ timeoutMs: 30_000 }), 0);
    await assert.rejects(t.read(), (e: unknown) => e instanceof FailedPrecondition && /onOutput/.test(e.message));
  }
  assert.equal(text(Buffer.concat(seen)), "env-ok /tmp\r\n");

  {
    await using sleeper = await sb.terminals.open({ command: ["sleep", "100"] });
    await sleeper.sendSignal("SIGINT");
    assert.equal(await sleeper.wait({ timeoutMs: 30_000 }), 130);
    assert.equal(sleeper.signal, 2);
    await assert.rejects(sleeper.write("late"), FailedPrecondition);
  }

  // close() hangs up a program that runs: SIGHUP; the sandbox forgets it.
  const hung = await sb.terminals.open({ command: ["sleep", "100"] });
  await hung.close();
  assert.deepEqual([hung.exitCode, hung.signal], [129, 1]);
  assert.ok(!(await sb.terminals.list()).some((t) => t.id === hung.id));
  await hung.close(); // twice is no error
});

test("a detached terminal runs on and a second client attaches with its scrollback", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  const term = await sb.terminals.open();
  await term.write("export K=kept; echo before-$((1 + 1))\n");
  await term.readUntil("before-2");
  const seq = term.lastSeq;
  await term.detach();
  await assert.rejects(term.write("echo lost\n"), FailedPrecondition);
  await assert.rejects(term.wait(), FailedPrecondition);
  const listed = await listedWhen(sb, term.id, (t) => t.attached === 0);
  assert.deepEqual([listed.attached, listed.exitCode], [0, undefined]); // it runs on, with no client

  // Another client (a connection of its own) attaches: the scrollback is replayed, then it follows.
  {
    await using other = await Sandbox.connect(sb.id);
    const again = await other.terminals.attach(term.id);
    assert.match(text(await again.readUntil("before-2", { timeoutMs: 10_000 })), /before-2/);
    await again.write("echo $K-after\n");
    await again.readUntil("kept-after");
    // An attach after a seq replays only what followed it.
    const later = await sb.terminals.attach(term.id, { afterSeq: seq });
    const replayed = text(await later.readUntil("kept-after", { timeoutMs: 10_000 }));
    assert.ok(!replayed.includes("before-2"), replayed);
    // Two clients at once: what one types, both see.
    await later.write("echo both-$((3 * 3))\n");
    await again.readUntil("both-9");
    await later.readUntil("both-9");
    await later.detach();
    await again.write("exit 4\n");
    assert.equal(await again.wait({ timeoutMs: 30_000 }), 4);
    // The other sandbox object's end detaches what it follows; nothing is left running.
  }
  await sb.terminals.close(term.id); // an ended terminal is forgotten
  assert.ok(!(await sb.terminals.list()).some((t) => t.id === term.id));
});

test("a terminal detached in its block runs on after the block", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  let id: string;
  {
    await using term = await sb.terminals.open();
    id = term.id;
    await term.write("export K=kept-in-block; echo in-$((2 + 2))\n");
    await term.readUntil("in-4");
    await term.detach();
  }
  const listed = await listedWhen(sb, id, (t) => t.attached === 0);
  assert.deepEqual([listed.attached, listed.exitCode], [0, undefined]);
  {
    await using again = await sb.terminals.attach(id);
    await again.readUntil("in-4", { timeoutMs: 10_000 });
    await again.write("echo $K\n");
    await again.readUntil("kept-in-block\r\n");
  }
  assert.ok(!(await sb.terminals.list()).some((t) => t.id === id));
});

test("terminal mistakes are typed errors and leave the terminal working", async () => {
  await runtime();
  await using sb = await Sandbox.create();
  await assert.rejects(sb.terminals.open({ command: "bash -l" as unknown as string[] }), (e: unknown) => {
    return e instanceof InvalidArgument && e.field === "command";
  });
  await assert.rejects(sb.terminals.open({ rows: 5000 }), (e: unknown) => e instanceof InvalidArgument && e.field === "rows");
  await assert.rejects(sb.terminals.open({ cols: 1.5 }), (e: unknown) => e instanceof InvalidArgument && e.field === "cols");
  await assert.rejects(sb.terminals.open({ idleTimeoutMs: -1 }), InvalidArgument);
  await assert.rejects(sb.terminals.open({ env: { X: 1 as unknown as string } }), (e: unknown) => {
    return e instanceof InvalidArgument && e.field === "env";
  });
  await assert.rejects(sb.terminals.attach("term-000000000000"), (e: unknown) => {
    return e instanceof NotFound && e.reason === "TERMINAL_NOT_FOUND";
  });
  await assert.rejects(sb.terminals.attach("not a terminal id"), InvalidArgument);
  await assert.rejects(sb.terminals.attach(""), (e: unknown) => e instanceof InvalidArgument && e.field === "terminalId");
  await assert.rejects(sb.terminals.attach("term-000000000000", { afterSeq: -1 }), InvalidArgument);
  await assert.rejects(sb.terminals.close("term-000000000000"), NotFound);
  await assert.rejects(sb.terminals.open({ command: ["/no/such/program"] }), FailedPrecondition);

  await using cat = await sb.terminals.open({ command: ["cat"] });
  await assert.rejects(cat.resize(0, 80), (e: unknown) => e instanceof InvalidArgument && e.field === "rows");
  await assert.rejects(cat.resize(10, 1001), (e: unknown) => e instanceof InvalidArgument && e.field === "cols");
  await assert.rejects(cat.sendSignal("NOPE"), (e: unknown) => e instanceof InvalidArgument && e.field === "signal");
  await assert.rejects(cat.write(42 as unknown as string), (e: unknown) => e instanceof InvalidArgument && e.field === "data");
  await assert.rejects(cat.read({ timeoutMs: -5 }), InvalidArgument);
  // Refused before they were sent: the terminal still works.
  await cat.write("still\n");
  await cat.readUntil("still\r\nstill\r\n"); // the echo, then cat's copy
  const started = Date.now();
  await assert.rejects(cat.readUntil("never", { timeoutMs: 500 }), DeadlineExceeded);
  assert.ok(Date.now() - started < 5000);
  await assert.rejects(cat.wait({ timeoutMs: 200 }), DeadlineExceeded);
  // An AbortSignal ends a wait with its reason.
  await assert.rejects(cat.read({ signal: AbortSignal.timeout(100) }), (e: unknown) => {
    return e instanceof DOMException && e.name === "TimeoutError";
  });
  assert.equal((await cat.read({ timeoutMs: 100 })).length, 0);
  await cat.write("\x04"); // Ctrl-D: cat ends
  await assert.rejects(cat.readUntil("never", { timeoutMs: 30_000 }), TerminalEnded);
  assert.equal(await cat.wait({ timeoutMs: 30_000 }), 0);
  await assert.rejects(cat.write("late"), FailedPrecondition);
});

test("a terminal stream cut by the network is attached again and every byte arrives once", async () => {
  const rt = await runtime();
  const proxy = await CuttableProxy.start(rt.port);
  try {
    await using sb = await Sandbox.create({ addr: proxy.addr, apiKey: rt.key });
    const term = await sb.terminals.open({
      command: ["sh", "-c", "for i in $(seq 1 60); do echo n$i; sleep 0.03; done; exit 9"],
    });
    let seen = "";
    for await (const chunk of term) {
      seen += text(chunk);
      if (proxy.cuts === 0 && seen.includes("n10\r\n")) proxy.cut();
    }
    assert.equal(proxy.cuts, 1);
    assert.equal(await term.wait({ timeoutMs: 10_000 }), 9);
    assert.deepEqual(
      seen.split(/\s+/).filter(Boolean),
      Array.from({ length: 60 }, (_, i) => `n${i + 1}`),
    );
  } finally {
    await proxy.close();
  }
});

test("after a cut, input goes on the stream attached again, once, and the size is kept", async () => {
  const rt = await runtime();
  const proxy = await CuttableProxy.start(rt.port);
  try {
    await using sb = await Sandbox.create({ addr: proxy.addr, apiKey: rt.key });
    await using term = await sb.terminals.open({ command: ["cat"], rows: 30, cols: 90 });
    await term.write("first\n");
    await term.readUntil("first\r\nfirst\r\n");
    proxy.cut();
    // (Input handed to a stream in the instant it breaks may be lost: no stream acknowledges input.)
    await new Promise((r) => setTimeout(r, 300));
    await term.write("second\n");
    await term.readUntil("second\r\nsecond\r\n", { timeoutMs: 20_000 });
    assert.equal(proxy.cuts, 1);
    const listed = (await sb.terminals.list()).find((t) => t.id === term.id);
    assert.deepEqual([listed?.rows, listed?.cols, listed?.attached], [30, 90, 1]);
    assert.equal((await term.read({ timeoutMs: 300 })).length, 0); // nothing twice
  } finally {
    await proxy.close();
  }
});

test("closing the sandbox's connection detaches its terminals, which run on", async () => {
  const rt = await runtime();
  const made = await Sandbox.create();
  try {
    const term = await made.terminals.open({ command: ["sleep", "300"] });
    await made.close();
    await assert.rejects(term.wait({ timeoutMs: 10_000 }), FailedPrecondition);
    await using again = await Sandbox.connect(made.id);
    const listed = await listedWhen(again, term.id, (t) => t.attached === 0);
    assert.deepEqual([listed.attached, listed.exitCode], [0, undefined]);
  } finally {
    await using cleanup = await Sandbox.connect(made.id, { addr: rt.addr, apiKey: rt.key });
    await cleanup.delete();
  }
});

test("a terminal link opens the web terminal", async () => {
  const rt = await runtime();
  await using sb = await Sandbox.create();
  await using term = await sb.terminals.open();
  const asked = Date.now();
  const link = await sb.terminals.link(term.id, { ttlMs: 120_000 });
  assert.ok(link.token);
  assert.equal(link.path, `/terminal#token=${link.token}`);
  assert.ok(link.url.endsWith(link.path));
  assert.ok(link.expiresAt && link.expiresAt.getTime() > asked && link.expiresAt.getTime() <= asked + 121_000);
  const page = await fetch(`http://${rt.httpAddr}${link.path.split("#")[0]}`);
  assert.equal(page.status, 200);
  await page.arrayBuffer();
  await assert.rejects(sb.terminals.link("", { ttlMs: 13 * 3600_000 }), InvalidArgument);
  await sb.terminals.revokeLinks();
});
