/**
 * Embedded mode: with no address configured, the SDK starts a runtime for this process and stops it at exit,
 * as the Python SDK's embedded mode does.
 *
 * The runtime binary is `MENTIS_RUNTIME_BIN`, else `mentis-runtime` on PATH. It listens on a free 127.0.0.1
 * port with a data folder of its own (a temporary directory, removed at exit) and its own instance name, so it
 * never touches another runtime's sandboxes; its HTTP listener (preview URLs, the web terminal) is on another
 * free 127.0.0.1 port. It still needs what every runtime needs: a Docker engine and the executor image
 * (`make image`, or the offline bundle).
 *
 * At the process's exit (its `exit` event, and SIGINT or SIGTERM when nothing else listens for them) the
 * sandboxes it made are deleted and it is stopped; `stopEmbedded()` does the same at once.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { accessSync, closeSync, constants, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer, connect as netConnect } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { ConfigError } from "./errors.js";

const START_WITHIN_MS = 120_000;
// Settings meant for another runtime are not taken over: its side listeners (their ports would not be free)
// and how its preview URLs are written (they would lead to that runtime's listener).
const NOT_INHERITED = new Set([
  "MENTIS_HEALTH_LISTEN",
  "MENTIS_METRICS_LISTEN",
  "MENTIS_PREVIEW_BASE_URL",
  "MENTIS_PREVIEW_DOMAIN",
]);

/** The runtime binary embedded mode starts (see the module's doc). */
export function runtimeBinary(): string {
  const explicit = process.env.MENTIS_RUNTIME_BIN;
  if (explicit) {
    try {
      accessSync(explicit, constants.X_OK);
    } catch {
      throw new ConfigError(`MENTIS_RUNTIME_BIN=${JSON.stringify(explicit)} is not an executable file`);
    }
    return explicit;
  }
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, "mentis-runtime");
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  throw new ConfigError(
    "no runtime address and no runtime to start: set MENTIS_ADDR (a running runtime), or " +
      "MENTIS_RUNTIME_BIN / put mentis-runtime on PATH for embedded mode",
  );
}

interface Embedded {
  addr: string;
  httpAddr: string;
  key: string;
  data: string;
  child: ChildProcess;
  stopped: boolean;
}

let current: Embedded | undefined;
let starting: Promise<Embedded> | undefined;
let hooked = false;

/** The embedded runtime's address and admin key, starting it on first use. */
export async function ensureEmbedded(): Promise<{ addr: string; key: string; httpAddr: string }> {
  if (current && !current.stopped && current.child.exitCode === null && current.child.signalCode === null) {
    return current;
  }
  starting ??= start().finally(() => {
    starting = undefined;
  });
  current = await starting;
  return current;
}

async function start(): Promise<Embedded> {
  const program = runtimeBinary();
  const data = mkdtempSync(join(tmpdir(), "mentis-embedded-"));
  const instance = `embedded-${process.pid}-${randomUUID().slice(0, 6)}`;
  const [port, httpPort] = (await freePorts(2)) as [number, number];
  const addr = `127.0.0.1:${port}`;
  const httpAddr = `127.0.0.1:${httpPort}`;
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!NOT_INHERITED.has(k)) env[k] = v;
  }
  Object.assign(env, {
    MENTIS_LISTEN: addr,
    MENTIS_HTTP_LISTEN: httpAddr,
    MENTIS_DATA_DIR: data,
    MENTIS_INSTANCE: instance,
    RUST_LOG: process.env.RUST_LOG ?? "warn",
  });
  const logPath = join(data, "runtime.log");
  const log = openSync(logPath, "w");
  const child = spawn(program, [], { env, stdio: ["ignore", log, log] });
  closeSync(log);
  // The runtime does not keep this process alive: the exit hooks stop it.
  child.unref();
  const embedded: Embedded = { addr, httpAddr, key: "", data, child, stopped: false };
  hookExit();
  const keyFile = join(data, "admin.key");
  const deadline = Date.now() + START_WITHIN_MS;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      const tail = readFileSync(logPath, "utf8").slice(-2000);
      rmSync(data, { recursive: true, force: true });
      throw new ConfigError(`the embedded runtime (${program}) exited with ${child.exitCode ?? child.signalCode}: ${tail}`);
    }
    if (existsSync(keyFile) && (await listening(port))) {
      embedded.key = readFileSync(keyFile, "utf8").trim();
      return embedded;
    }
    if (Date.now() > deadline) {
      stopSync(embedded);
      throw new ConfigError(`the embedded runtime did not start within ${START_WITHIN_MS / 1000} s`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Deletes the sandboxes the embedded runtime made, stops it and removes its data folder (nothing when none
 * runs). The next call that needs it starts another. */
export async function stopEmbedded(): Promise<void> {
  const e = current ?? (await starting?.catch(() => undefined));
  current = undefined;
  if (e) stopSync(e);
}

/** The stop, done by a helper process (embedded-stop.js) this one waits for: it also runs in an `exit` event,
 * where nothing asynchronous can. */
function stopSync(e: Embedded): void {
  if (e.stopped) return;
  e.stopped = true;
  if (e.child.exitCode === null && e.child.signalCode === null && e.child.pid !== undefined) {
    const helper = fileURLToPath(new URL("./embedded-stop.js", import.meta.url));
    spawnSync(process.execPath, [helper, e.addr, e.key, String(e.child.pid)], {
      stdio: "ignore",
      timeout: 90_000,
    });
    try {
      e.child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
  rmSync(e.data, { recursive: true, force: true });
}

function hookExit(): void {
  if (hooked) return;
  hooked = true;
  process.on("exit", () => {
    if (current) stopSync(current);
  });
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    // Only when nobody else handles the signal: a listener of ours would otherwise change what it does.
    if (process.listenerCount(signal) === 0) {
      process.once(signal, () => {
        if (current) stopSync(current);
        process.kill(process.pid, signal);
      });
    }
  }
}

async function freePorts(n: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
          const s = createServer();
          s.once("error", reject);
          s.listen(0, "127.0.0.1", () => resolve(s));
        }),
    ),
  );
  const ports = servers.map((s) => {
    const a = s.address();
    return typeof a === "object" && a ? a.port : 0;
  });
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = netConnect({ host: "127.0.0.1", port });
    socket.setTimeout(500);
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
    socket.once("timeout", () => {
      socket.destroy();
      resolve(false);
    });
  });
}
