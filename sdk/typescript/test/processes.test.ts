/** A sandbox's processes (`sb.processes`: list, sendSignal, kill), against a real runtime and real sandboxes. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { FailedPrecondition, InvalidArgument, NotFound, type ProcessInfo, Sandbox } from "mentis-sandbox";
import { runtime } from "./harness.js";
import { refused, sleep, soon } from "./expect.js";

// At the top level: the runtime is stopped after the file's last test.
await runtime();

function byPid(processes: ProcessInfo[]): Map<number, ProcessInfo> {
  return new Map(processes.map((p) => [p.pid, p]));
}

/** Starts `command` in the background of the sandbox, left running after the shell ends, and returns its pid
 * once it runs the program (a moment after `$!` is known its argv is the shell's, then nohup's). */
async function start(sb: Sandbox, command: string, argv: string[]): Promise<number> {
  const r = await sb.run(`nohup ${command} >/dev/null 2>&1 & echo $!`);
  assert.ok(r.ok, r.stderr);
  const pid = Number(r.stdout);
  await soon(
    async () => JSON.stringify(byPid(await sb.processes.list()).get(pid)?.command) === JSON.stringify(argv),
    `${command} started`,
    10_000,
    20,
  );
  return pid;
}

async function goneSoon(sb: Sandbox, pid: number): Promise<void> {
  await soon(async () => !byPid(await sb.processes.list()).has(pid), `process ${pid} gone`);
}

async function stateSoon(sb: Sandbox, pid: number, state: string): Promise<void> {
  await soon(async () => byPid(await sb.processes.list()).get(pid)?.state === state, `process ${pid} in state ${state}`);
}

test("the list shows a background process with its argv, user and times, and the sandbox's own by role", async () => {
  await using sb = await Sandbox.create();
  const before = Date.now();
  const pid = await start(sb, "sleep 3171", ["sleep", "3171"]);
  const after = Date.now();
  assert.ok((await sb.runCode("6 * 7")).ok); // the kernel runs
  const listed = await sb.processes.list();
  assert.deepEqual(
    listed.map((p) => p.pid),
    listed.map((p) => p.pid).sort((a, b) => a - b),
  ); // by pid
  const sleeper = byPid(listed).get(pid);
  assert.ok(sleeper);
  const uid = Number((await sb.run("id -u")).stdout);
  assert.deepEqual([sleeper.command, sleeper.name], [["sleep", "3171"], "sleep"]);
  assert.deepEqual([sleeper.user, sleeper.uid], ["sandbox", uid]);
  assert.deepEqual([sleeper.ppid, sleeper.state, sleeper.role], [1, "S", ""]); // its shell ended: init adopted it
  assert.ok(sleeper.pgid > 1 && sleeper.memoryBytes > 0 && sleeper.cpuSeconds >= 0 && sleeper.cpuPercent >= 0);
  assert.equal(typeof sleeper.memoryBytes, "number");
  // The runtime counts a start from the boot time, which the kernel gives in whole seconds.
  assert.ok(sleeper.startTime instanceof Date);
  const started = sleeper.startTime.getTime();
  assert.ok(before - 2_000 <= started && started <= after + 2_000, `${before} ${started} ${after}`);
  // As `ps` in the sandbox sees it.
  const ps = (await sb.run(`ps -o pid=,ppid=,pgid=,user=,s=,args= -p ${pid}`)).stdout.split(/\s+/).filter(Boolean);
  assert.deepEqual(ps.slice(0, 5), [String(pid), "1", String(sleeper.pgid), "sandbox", "S"]);
  assert.deepEqual(ps.slice(5), sleeper.command);

  const roles = new Map(listed.filter((p) => p.role).map((p) => [p.role, p]));
  assert.deepEqual([...roles.keys()].sort(), ["executor", "init", "ipython-kernel"]);
  assert.deepEqual([roles.get("init")?.pid, roles.get("init")?.user], [1, "root"]);
  assert.ok(roles.get("executor")?.command[0]?.endsWith("mentis-executor"));
  assert.ok(roles.get("ipython-kernel")?.command.includes("ipykernel_launcher"));
  assert.equal(listed.filter((p) => p.role === "executor").length, 1);
  await sb.processes.kill(pid);
  await goneSoon(sb, pid);
});

test("signals reach one process by name, and kill ends it", async () => {
  await using sb = await Sandbox.create();
  // A process that traps TERM says so; STOP and CONT stop it and let it go on.
  const script = 'trap "echo trapped > term.txt; exit 0" TERM; touch ready; while :; do sleep 0.1; done';
  const pid = await start(sb, `bash -c '${script}'`, ["bash", "-c", script]);
  await soon(() => sb.files.exists("ready"), "ready");
  await sb.processes.sendSignal(pid, "STOP");
  await stateSoon(sb, pid, "T");
  await sb.processes.sendSignal(pid, "cont"); // any case
  await stateSoon(sb, pid, "S");
  await sb.processes.sendSignal(pid, "SIGTERM"); // with SIG
  await goneSoon(sb, pid);
  assert.equal(await sb.files.readText("term.txt"), "trapped\n");

  // KILL cannot be trapped.
  const stubborn = 'trap "" TERM INT HUP; touch ignoring; while :; do sleep 0.1; done';
  const other = await start(sb, `bash -c '${stubborn}'`, ["bash", "-c", stubborn]);
  await soon(() => sb.files.exists("ignoring"), "ignoring");
  await sb.processes.sendSignal(other, "TERM");
  await sb.processes.sendSignal(other, "INT");
  await sleep(300);
  assert.ok(["S", "R"].includes(byPid(await sb.processes.list()).get(other)?.state ?? "")); // ignored
  await sb.processes.kill(other);
  await goneSoon(sb, other);
});

test("signal mistakes are typed errors, and the sandbox's own processes are refused", async () => {
  await using sb = await Sandbox.create();
  const listed = await sb.processes.list();
  const executor = listed.find((p) => p.role === "executor")?.pid;
  assert.ok(executor);
  for (const pid of [1, executor]) {
    await refused(sb.processes.kill(pid), FailedPrecondition);
    await refused(sb.processes.sendSignal(pid, "TERM"), FailedPrecondition);
  }
  const still = byPid(await sb.processes.list());
  assert.ok(still.has(1) && still.has(executor)); // still there
  assert.equal((await sb.run("echo alive")).stdout, "alive\n");

  const unknown = 4_000_000; // above any pid the sandbox has made
  assert.ok(!byPid(listed).has(unknown));
  await refused(sb.processes.kill(unknown), NotFound, { reason: "PROCESS_NOT_FOUND" });
  for (const pid of [0, -5]) await refused(sb.processes.kill(pid), InvalidArgument, { field: "pid" });
  const pid = await start(sb, "sleep 600", ["sleep", "600"]);
  await refused(sb.processes.sendSignal(pid, "NOPE"), InvalidArgument, { field: "signal" });
  // Refused here, before any call.
  for (const wrong of ["12", 1.5, true, 2 ** 31, Number.NaN, undefined]) {
    await refused(sb.processes.kill(wrong as unknown as number), InvalidArgument, { field: "pid" });
  }
  await refused(sb.processes.sendSignal(pid, 9 as unknown as string), InvalidArgument, { field: "signal" });
  assert.ok(byPid(await sb.processes.list()).has(pid)); // none of that reached it
  // A stopped process is killed all the same; then it is not there to signal.
  await sb.processes.sendSignal(pid, "STOP");
  await stateSoon(sb, pid, "T");
  await sb.processes.kill(pid);
  await goneSoon(sb, pid);
  await refused(sb.processes.sendSignal(pid, "TERM"), NotFound, { reason: "PROCESS_NOT_FOUND" });
});
