/**
 * The embedded runtime's stop (see embedded.ts), as a process of its own so that an `exit` event can wait for
 * it: deletes every sandbox the runtime at argv[2] (key argv[3]) lists, then sends SIGTERM to pid argv[4] and
 * waits up to 30 s for it to end (SIGKILL after).
 */
import { readFileSync } from "node:fs";
import { Connection } from "./client.js";

/** Whether `pid` still runs: a zombie (ended, not yet reaped by the process waiting for this one) does not. */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

async function main(): Promise<void> {
  const [addr, key, pidText] = process.argv.slice(2);
  const pid = Number(pidText);
  if (addr) {
    const conn = await Connection.open({ addr, apiKey: key || undefined });
    try {
      const ids: string[] = [];
      let pageToken = "";
      do {
        const page = await conn.sandboxes.listSandboxes({ pageToken }, { timeoutMs: 30_000 });
        ids.push(...page.sandboxes.map((s) => s.sandboxId));
        pageToken = page.nextPageToken;
      } while (pageToken);
      await Promise.all(
        ids.map((sandboxId) => conn.sandboxes.deleteSandbox({ sandboxId }, { timeoutMs: 60_000 }).catch(() => undefined)),
      );
    } catch {
      // the runtime is stopped below all the same
    } finally {
      conn.close();
    }
  }
  if (pid > 0) {
    try {
      process.kill(pid, "SIGTERM");
    } catch {
      return;
    }
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (!running(pid)) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone
    }
  }
}

await main();
