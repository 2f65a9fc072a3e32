/** Embedded mode: a process with no address starts a runtime of its own, and cleans up when it ends. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { ConfigError, runtimeBinary } from "mentis-sandbox";

const packageDir = fileURLToPath(new URL("../..", import.meta.url));

function childEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const name of ["MENTIS_ADDR", "MENTIS_API_KEY", "MENTIS_DATA_DIR"]) delete env[name];
  return env;
}

/** Runs `code` as an ES module in a fresh Node process in the package's folder; its stdout and exit status. */
function node(
  code: string,
  env: NodeJS.ProcessEnv,
): Promise<{ status: number | null; stdout: string; stderr: string; pid: number; ms: number }> {
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", code], { cwd: packageDir, env });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("close", (status) => resolve({ status, stdout, stderr, pid: child.pid ?? 0, ms: Date.now() - started }));
  });
}

/** The processes whose environment names the embedded runtime instance of process `pid`. */
function runtimesOf(pid: number): number[] {
  const found: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/environ`, "latin1").includes(`MENTIS_INSTANCE=embedded-${pid}-`)) found.push(Number(entry));
    } catch {
      // gone, or not ours to read
    }
  }
  return found;
}

function containersOf(sandboxId: string): string[] {
  const r = spawnSync("docker", ["ps", "-aq", "--filter", `label=io.mentis.sandbox-id=${sandboxId}`], { encoding: "utf8" });
  return r.stdout.split(/\s+/).filter(Boolean);
}


test("a process with no address starts a runtime, and at its end deletes its sandboxes and stops it", async () => {
  assert.ok(process.env.MENTIS_RUNTIME_BIN, "MENTIS_RUNTIME_BIN names the runtime to embed");
  // The script neither deletes its sandbox nor closes anything: its process ends when its work is done, and
  // the embedded runtime goes with it.
  const script = `
    import { Sandbox } from "mentis-sandbox";
    const sb = await Sandbox.create();
    const cell = await sb.runCode("6 * 7");
    console.log(cell.results[0].text, sb.id);
  `;
  const r = await node(script, childEnv());
  assert.equal(r.status, 0, r.stderr);
  const [answer, sandboxId] = r.stdout.trim().split(" ");
  assert.equal(answer, "42");
  assert.ok(sandboxId);
  // Nothing of the SDK's (its connection, the runtime) kept the process alive once its work was done.
  assert.ok(r.ms < 60_000, `the process took ${r.ms} ms`);
  assert.deepEqual(containersOf(sandboxId), []);
  assert.deepEqual(runtimesOf(r.pid), []);

  // process.exit() in the middle of things: the same.
  const exiting = await node(
    `import { Sandbox } from "mentis-sandbox";
     const sb = await Sandbox.create();
     await sb.run("sleep 60", { background: true });
     console.log(sb.id);
     process.exit(3);`,
    childEnv(),
  );
  assert.equal(exiting.status, 3, exiting.stderr);
  assert.deepEqual(containersOf(exiting.stdout.trim()), []);
  assert.deepEqual(runtimesOf(exiting.pid), []);
});

test("without a runtime to start, embedded mode says what to set", async () => {
  const saved = process.env.MENTIS_RUNTIME_BIN;
  process.env.MENTIS_RUNTIME_BIN = "/nonexistent/mentis-runtime";
  try {
    assert.throws(() => runtimeBinary(), (e: unknown) => e instanceof ConfigError && /MENTIS_RUNTIME_BIN/.test(e.message));
  } finally {
    process.env.MENTIS_RUNTIME_BIN = saved;
  }
  const env = childEnv();
  delete env.MENTIS_RUNTIME_BIN;
  env.PATH = "/usr/bin:/bin";
  const r = await node(`import { Sandbox } from "mentis-sandbox"; await Sandbox.create();`, env);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /ConfigError/);
  assert.match(r.stderr, /MENTIS_ADDR/);
});
