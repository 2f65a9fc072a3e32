/**
 * A real runtime for the SDK's tests: `MENTIS_RUNTIME_BIN` (tests/sdk-ts-check.sh passes
 * target/debug/mentis-runtime) on a free 127.0.0.1 port with a data folder of its own, real Docker sandboxes
 * behind it. Every sandbox a test file leaves is deleted before its runtime stops, and whatever Docker objects
 * of the runtime's instance are left after that are removed (also when a test failed).
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, openSync, closeSync, readFileSync, existsSync, rmSync } from "node:fs";
import { createServer, connect, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { after } from "node:test";
import { Connection } from "mentis-sandbox";

export async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve, reject) => {
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => resolve());
  });
  const address = s.address();
  await new Promise((r) => s.close(r));
  if (typeof address !== "object" || !address) throw new Error("no port");
  return address.port;
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port });
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

export class Runtime {
  port = 0;
  addr = "";
  httpAddr = "";
  key = "";
  readonly instance = `sdk-ts-${randomUUID().slice(0, 8)}`;
  readonly data = mkdtempSync(join(tmpdir(), "mentis-sdk-ts-"));
  readonly logPath = `${this.data}.log`;
  private child: ChildProcess | undefined;

  async start(): Promise<void> {
    const binary = process.env.MENTIS_RUNTIME_BIN;
    if (!binary) {
      throw new Error("MENTIS_RUNTIME_BIN must name the mentis-runtime to test against (tests/sdk-ts-check.sh sets it)");
    }
    this.port = await freePort();
    this.addr = `127.0.0.1:${this.port}`;
    this.httpAddr = `127.0.0.1:${await freePort()}`;
    const env: NodeJS.ProcessEnv = { ...process.env };
    delete env.MENTIS_ADDR;
    delete env.MENTIS_API_KEY;
    Object.assign(env, {
      MENTIS_LISTEN: this.addr,
      MENTIS_HTTP_LISTEN: this.httpAddr,
      MENTIS_DATA_DIR: this.data,
      MENTIS_INSTANCE: this.instance,
      RUST_LOG: process.env.RUST_LOG ?? "warn",
    });
    const log = openSync(this.logPath, "w");
    this.child = spawn(binary, [], { env, stdio: ["ignore", log, log] });
    closeSync(log);
    const deadline = Date.now() + 120_000;
    const keyFile = join(this.data, "admin.key");
    for (;;) {
      if (this.child.exitCode !== null) {
        throw new Error(`the runtime exited with ${this.child.exitCode}; log: ${this.logPath}`);
      }
      if (existsSync(keyFile) && (await listening(this.port))) {
        this.key = readFileSync(keyFile, "utf8").trim();
        return;
      }
      if (Date.now() > deadline) throw new Error(`the runtime did not listen within 120 s; log: ${this.logPath}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** MENTIS_ADDR and MENTIS_API_KEY of this process point at the runtime. */
  useEnv(): void {
    process.env.MENTIS_ADDR = this.addr;
    process.env.MENTIS_API_KEY = this.key;
  }

  async deleteAll(): Promise<void> {
    const conn = await Connection.open({ addr: this.addr, apiKey: this.key });
    try {
      let pageToken = "";
      const ids: string[] = [];
      do {
        const page = await conn.sandboxes.listSandboxes({ pageToken });
        ids.push(...page.sandboxes.map((s) => s.sandboxId));
        pageToken = page.nextPageToken;
      } while (pageToken);
      await Promise.all(ids.map((sandboxId) => conn.sandboxes.deleteSandbox({ sandboxId }).catch(() => undefined)));
    } finally {
      conn.close();
    }
  }

  async stop(): Promise<void> {
    try {
      if (this.child && this.child.exitCode === null) await this.deleteAll();
    } finally {
      const child = this.child;
      if (child && child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(this.data, { recursive: true, force: true });
      this.sweep();
    }
  }

  /** Removes whatever Docker objects of this runtime's instance are left (none when every test did its part). */
  sweep(): void {
    const label = `label=io.mentis.instance=${this.instance}`;
    for (const [kind, listing] of [
      ["container", ["ps", "-aq"]],
      ["volume", ["volume", "ls", "-q"]],
    ] as const) {
      const left = spawnSync("docker", [...listing, "--filter", label], { encoding: "utf8" }).stdout.split(/\s+/).filter(Boolean);
      if (left.length) {
        console.error(`harness: removing ${left.length} ${kind}(s) instance ${this.instance} left`);
        spawnSync("docker", [kind, "rm", "-f", ...left]);
      }
    }
  }
}

let shared: Promise<Runtime> | undefined;
let made: Runtime | undefined;

// Registered as the module loads, so that it runs after the file's last test: `after` called inside a test
// would be that test's hook, and stop the runtime before the next test.
after(() => made?.stop());

/** This test file's runtime (one per file: node --test runs each file in a process of its own), with
 * MENTIS_ADDR / MENTIS_API_KEY pointing at it; stopped after the file's tests. */
export function runtime(): Promise<Runtime> {
  shared ??= (async () => {
    const rt = new Runtime();
    made = rt;
    await rt.start();
    rt.useEnv();
    return rt;
  })();
  return shared;
}

/** A TCP proxy in front of the runtime that a test can cut: every open connection is reset at once, as a
 * network drop would, and new connections are let through again. */
export class CuttableProxy {
  private readonly server: Server;
  private open = new Set<Socket>();
  cuts = 0;
  addr = "";

  private constructor(private readonly targetPort: number) {
    this.server = createServer((client) => {
      const upstream = connect({ host: "127.0.0.1", port: this.targetPort });
      this.open.add(client);
      this.open.add(upstream);
      client.pipe(upstream);
      upstream.pipe(client);
      const drop = () => {
        client.destroy();
        upstream.destroy();
        this.open.delete(client);
        this.open.delete(upstream);
      };
      client.on("error", drop).on("close", drop);
      upstream.on("error", drop).on("close", drop);
    });
  }

  static async start(targetPort: number): Promise<CuttableProxy> {
    const p = new CuttableProxy(targetPort);
    await new Promise<void>((resolve) => p.server.listen(0, "127.0.0.1", () => resolve()));
    const address = p.server.address();
    if (typeof address !== "object" || !address) throw new Error("no port");
    p.addr = `127.0.0.1:${address.port}`;
    return p;
  }

  /** Resets every open connection (RST, as a dropped network ends them). */
  cut(): void {
    this.cuts++;
    for (const s of this.open) s.resetAndDestroy();
    this.open.clear();
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise((r) => this.server.close(r));
  }
}
