/** Commands, cells, the sandbox's life and the errors, against a real runtime and real sandboxes. */
import { before, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import {
  CommandHandle,
  ConfigError,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  Sandbox,
  Unauthenticated,
} from "mentis-sandbox";
import { CuttableProxy, runtime, type Runtime } from "./harness.js";

let rt: Runtime;
let sb: Sandbox;

before(async () => {
  rt = await runtime();
  sb = await Sandbox.create({ labels: { test: "sandbox.test" } });
});
// (The harness deletes `sb` with every other sandbox of the file's runtime, after the file's tests.)

test("a command gives its exit code, streams and live output", async () => {
  const live: string[] = [];
  const r = await sb.run("echo out; echo err >&2; printf 'caf\\xc3'; printf '\\xa9\\n'; exit 3", {
    onStdout: (t) => live.push(t),
  });
  assert.deepEqual([r.exitCode, r.reason, r.ok], [3, "exited", false]);
  assert.equal(r.stdout, "out\ncafé\n");
  assert.equal(r.stderr, "err\n");
  // A character split across two writes reaches the callback whole.
  assert.equal(live.join(""), "out\ncafé\n");
  assert.ok(r.actionId);
});

test("env, cwd, stdin and the timeout", async () => {
  const made = await sb.run("mkdir -p sub && cd sub && pwd");
  assert.match(made.stdout.trim(), /\/sub$/);
  assert.equal((await sb.run("echo $A-$B", { env: { A: "1", B: "2" } })).stdout, "1-2\n");
  assert.equal((await sb.run("cat", { stdin: "fed\n" })).stdout, "fed\n");
  assert.equal((await sb.run("wc -c", { stdin: new Uint8Array(1000) })).stdout.trim(), "1000");
  assert.match((await sb.run("pwd", { cwd: "sub" })).stdout.trim(), /\/sub$/);
  const slow = await sb.run("sleep 30", { timeoutMs: 1000 });
  assert.equal(slow.reason, "timed_out");
  assert.equal(slow.exitCode, -1);
});

test("a session keeps cwd and variables", async () => {
  assert.ok((await sb.run("cd /tmp && export N=5", { session: "work" })).ok);
  assert.equal((await sb.run("echo $(pwd) $N", { session: "work" })).stdout, "/tmp 5\n");
  assert.equal((await sb.run("echo ${N:-unset}")).stdout, "unset\n");
});

test("cells keep state and return text, rich results and errors with their traceback", async () => {
  const first = await sb.runCode("x = 6 * 7\nprint('hello')");
  assert.deepEqual([first.status, first.text, first.error], ["ok", "hello\n", undefined]);
  const value = await sb.runCode("x");
  assert.equal(value.results.length, 1);
  assert.equal(value.results[0]?.text, "42");
  assert.equal(value.results[0]?.isResult, true);
  const printed: string[] = [];
  await sb.runCode("for i in range(3): print(i)", { onOutput: (t) => printed.push(t) });
  assert.equal(printed.join(""), "0\n1\n2\n");
  const html = await sb.runCode("from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))");
  assert.equal(html.results[0]?.html, "<b>bold</b>");
  assert.equal(html.results[0]?.isResult, false);
  const failed = await sb.runCode("1/0");
  assert.equal(failed.status, "error");
  assert.equal(failed.ok, false);
  assert.equal(failed.error?.name, "ZeroDivisionError");
  assert.ok(failed.error?.traceback.some((line) => line.includes("ZeroDivisionError")));
  const image = await sb.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()");
  const png = image.results.find((r) => r.png)?.png;
  assert.ok(png, JSON.stringify(image.results.map((r) => Object.keys(r.data))));
  assert.deepEqual([...png.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
});

test("an abort cancels the command in the sandbox and rejects with the signal's reason", async () => {
  const controller = new AbortController();
  const marker = `m${randomUUID().slice(0, 8)}`;
  const running = sb.run(`echo started; sleep 30; touch ${marker}`, {
    signal: controller.signal,
    onStdout: () => controller.abort(new Error("enough")),
  });
  await assert.rejects(running, /enough/);
  // The command was cancelled where it ran: nothing of it runs on.
  const left = await sb.run("for i in $(seq 50); do pgrep -x sleep >/dev/null || { echo none; exit; }; sleep 0.1; done; echo still");
  assert.equal(left.stdout.trim(), "none");
  assert.equal((await sb.run(`test -e ${marker}; echo $?`)).stdout.trim(), "1");
  // An already aborted signal runs nothing.
  await assert.rejects(sb.run(`touch ${marker}`, { signal: AbortSignal.abort(new Error("before")) }), /before/);
  assert.equal((await sb.run(`test -e ${marker}; echo $?`)).stdout.trim(), "1");
});

test("a background command is followed, waited for, killed, detached and attached again", async () => {
  const out: string[] = [];
  const handle = await sb.run("for i in 1 2 3; do echo $i; sleep 0.2; done", {
    background: true,
    onStdout: (t) => out.push(t),
  });
  assert.ok(handle instanceof CommandHandle);
  const r = await handle.wait();
  assert.deepEqual([r.exitCode, r.stdout, out.join("")], [0, "1\n2\n3\n", "1\n2\n3\n"]);

  const long = await sb.run("sleep 60", { background: true });
  await long.kill();
  assert.equal((await long.wait()).reason, "cancelled");

  const detached = await sb.run("echo before; sleep 1; echo after", { background: true });
  await detached.detach();
  await assert.rejects(detached.wait(), FailedPrecondition);
  const again = await sb.attachCommand(detached.actionId);
  const whole = await again.wait();
  assert.equal(whole.stdout, "before\nafter\n");

  await assert.rejects(sb.attachCommand(randomUUID()), (e: unknown) => e instanceof NotFound && e.reason === "ACTION_NOT_FOUND");
});

test("a dropped network is resumed: every byte arrives once and the command runs once", async () => {
  const proxy = await CuttableProxy.start(rt.port);
  try {
    await using cut = await Sandbox.create({ addr: proxy.addr, apiKey: rt.key });
    const seen: string[] = [];
    const cutAt = new Set(["10\n", "30\n", "50\n"]);
    const r = await cut.run(
      "echo ran >> runs; for i in $(seq 1 60); do echo $i; sleep 0.03; done",
      {
        onStdout: (t) => {
          seen.push(t);
          for (const line of t.split(/(?<=\n)/)) {
            if (cutAt.delete(line)) proxy.cut();
          }
        },
      },
    );
    const expected = Array.from({ length: 60 }, (_, i) => `${i + 1}\n`).join("");
    assert.equal(proxy.cuts, 3);
    assert.deepEqual([r.exitCode, r.stdout, seen.join("")], [0, expected, expected]);
    assert.equal((await cut.run("cat runs")).stdout, "ran\n");

    // Answers lost before they came: the SDK sends the same action id again, which the runtime runs once.
    proxy.holdReplies();
    const submitted = cut.run("echo once >> submits; echo done", { background: true });
    await new Promise((r) => setTimeout(r, 1500));
    proxy.cut();
    const handle = await submitted;
    assert.equal((await handle.wait()).stdout, "done\n");
    proxy.holdReplies();
    const executed = cut.run("echo once >> executes; echo done");
    await new Promise((r) => setTimeout(r, 1500));
    proxy.cut();
    assert.equal((await executed).stdout, "done\n");
    assert.equal((await cut.run("cat submits executes")).stdout, "once\nonce\n");
    assert.equal(proxy.cuts, 5);
  } finally {
    await proxy.close();
  }
});

test("pause, resume, connect and getOrCreate", async () => {
  const key = `conv-${Date.now()}`;
  const first = await Sandbox.getOrCreate({ key });
  const again = await Sandbox.getOrCreate({ key });
  try {
    assert.equal(first.id, again.id);
    assert.equal((await first.pause()).state, "paused");
    assert.equal((await first.resume()).state, "running");
    assert.equal((await first.run("echo back")).stdout, "back\n");
    const byId = await Sandbox.connect(first.id);
    assert.equal(byId.info.key, key);
    await byId.close();
  } finally {
    assert.equal(await first.delete(), true);
    assert.equal(await first.delete(), false);
    await first.close();
    await again.close();
  }
  // A deleted sandbox's record stays, final.
  const gone = await Sandbox.connect(first.id);
  assert.equal(gone.state, "terminated");
  await gone.close();
});

test("await using deletes what it created unless kept; list finds by labels and state", async () => {
  const label = { run: randomUUID().slice(0, 8) };
  let madeId = "";
  {
    await using made = await Sandbox.create({ labels: label });
    madeId = made.id;
  }
  const made = await Sandbox.connect(madeId);
  assert.equal(made.state, "terminated");
  await made.close();
  let keptId = "";
  {
    await using kept = await Sandbox.create({ keep: true, labels: label });
    keptId = kept.id;
  }
  const listed = await Sandbox.list({ labels: label, state: "running", pageSize: 1 });
  assert.deepEqual(listed.map((s) => s.id), [keptId]);
  const kept = await Sandbox.connect(keptId);
  assert.ok((await kept.run("true")).ok);
  await kept.delete();
  await kept.close();
});

test("mistakes are typed errors with the runtime's details", async () => {
  await assert.rejects(Sandbox.create({ memoryMb: -5 }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgument);
    assert.equal(e.code, "INVALID_ARGUMENT");
    assert.ok(e.reason && e.field, String(e));
    return true;
  });
  await assert.rejects(Sandbox.connect(randomUUID()), (e: unknown) => e instanceof NotFound && e.reason === "SANDBOX_NOT_FOUND");
  await assert.rejects(Sandbox.connect("not-a-sandbox-id"), InvalidArgument);
  await assert.rejects(Sandbox.create({ apiKey: "mk_wrong" }), Unauthenticated);
  await assert.rejects(sb.run("true", { timeoutMs: -1 }), (e: unknown) => e instanceof InvalidArgument && e.field === "timeoutMs");
  await assert.rejects(Sandbox.create({ addr: "ftp://x:1" }), ConfigError);
  await assert.rejects(Sandbox.create({ memoryMb: 1.5 }), (e: unknown) => e instanceof InvalidArgument && e.field === "memoryMb");
  await assert.rejects(Sandbox.create({ pidsLimit: Number.NaN }), (e: unknown) => e instanceof InvalidArgument && e.field === "pidsLimit");
  // No address: embedded mode, which needs a runtime binary to start.
  const saved = { addr: process.env.MENTIS_ADDR, bin: process.env.MENTIS_RUNTIME_BIN };
  delete process.env.MENTIS_ADDR;
  process.env.MENTIS_RUNTIME_BIN = "/nonexistent/mentis-runtime";
  try {
    await assert.rejects(Sandbox.create(), ConfigError);
  } finally {
    process.env.MENTIS_ADDR = saved.addr;
    process.env.MENTIS_RUNTIME_BIN = saved.bin;
  }
});
