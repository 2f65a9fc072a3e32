/**
 * The processes of a sandbox (ActionService.ListProcesses and SignalProcess).
 *
 *     for (const p of await sb.processes.list()) {   // as `ps` inside the sandbox would show them
 *       console.log(p.pid, p.user, p.command, p.role);  // role: "init", "executor", "ipython-kernel" or ""
 *     }
 *     await sb.processes.sendSignal(pid, "INT");      // TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT, ...
 *     await sb.processes.kill(pid);                   // SIGKILL
 *
 * Signals go to one process, without a shell. A command started with `run` is better ended with its
 * `CommandHandle.kill()` (its whole process group); these are for what a command left running (`nohup ... &`,
 * a server) and for what an agent sees in `ps`.
 */
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { ProcessInfo as ProcessInfoMessage } from "./gen/mentis/v1/action_pb.js";
import { InvalidArgument } from "./errors.js";
import type { Sandbox } from "./sandbox.js";

// A pid is an int32 on the wire.
const MAX_PID = 2 ** 31 - 1;

/**
 * One process of a sandbox when it was listed, as `ps` inside the sandbox would show it. `pid`, `ppid` and
 * `pgid` are as the sandbox sees them (its own pid namespace; a shell command's processes are in the process
 * group of the command's first process).
 */
export interface ProcessInfo {
  pid: number;
  ppid: number;
  pgid: number;
  /** The effective user id. */
  uid: number;
  /** The user's name in the sandbox (the number when it has none). */
  user: string;
  /** Its argv (empty for a zombie). */
  command: string[];
  /** The kernel's short name (at most 15 bytes). */
  name: string;
  /** One letter as `ps` shows it: `R` running, `S` sleeping, `D` waiting on I/O, `T` stopped, `Z` zombie, ... */
  state: string;
  /** CPU time used so far (user and system), in seconds. */
  cpuSeconds: number;
  /** CPU used over its life, in percent of one CPU (`ps`'s %CPU). */
  cpuPercent: number;
  /** Resident memory, in bytes. */
  memoryBytes: number;
  /** When it started (the kernel counts in whole seconds since boot, so within a second or so). */
  startTime: Date | undefined;
  /** What it is to the sandbox: `"init"` (PID 1), `"executor"` (MentisSandbox's agent in it),
   * `"ipython-kernel"` (the kernel of `runCode`), or `""` for everything else. */
  role: string;
}

function processInfo(p: ProcessInfoMessage): ProcessInfo {
  return {
    pid: p.pid,
    ppid: p.ppid,
    pgid: p.pgid,
    uid: p.uid,
    user: p.user,
    command: [...p.command],
    name: p.name,
    state: p.state,
    cpuSeconds: p.cpuSeconds,
    cpuPercent: p.cpuPercent,
    memoryBytes: Number(p.memoryBytes),
    startTime: p.startTime ? timestampDate(p.startTime) : undefined,
    role: p.role,
  };
}

/** The sandbox's processes (sandbox.processes): `list` them, `sendSignal` to one, `kill` one. */
export class Processes {
  constructor(private readonly sandbox: Sandbox) {}

  private get conn() {
    return this.sandbox.connection;
  }

  /** Every process of the sandbox at the moment of the call, by pid, PID 1 and the executor included (tell
   * them by `role`). */
  async list(): Promise<ProcessInfo[]> {
    const r = await this.conn.call(() => this.conn.actions.listProcesses({ sandboxId: this.sandbox.id }));
    return r.processes.map(processInfo);
  }

  /**
   * Sends `signal` to process `pid` of the sandbox: `"TERM"`, `"KILL"`, `"INT"`, `"HUP"`, `"QUIT"`, `"USR1"`,
   * `"USR2"`, `"STOP"`, `"CONT"`, `"TSTP"` or `"WINCH"` (any case, with or without SIG; another name is
   * InvalidArgument, field `signal`). A pid the sandbox does not have is NotFound (reason PROCESS_NOT_FOUND);
   * PID 1 and the executor are FailedPrecondition (delete or pause the sandbox instead); a pid that is no whole
   * number, or 0 or less, is InvalidArgument (field `pid`).
   */
  async sendSignal(pid: number, signal: string): Promise<void> {
    if (typeof pid !== "number" || !Number.isInteger(pid) || Math.abs(pid) > MAX_PID) {
      throw new InvalidArgument(`pid ${String(pid)} names no process`, { field: "pid" });
    }
    if (typeof signal !== "string") {
      throw new InvalidArgument(`signal is a name such as "TERM", not ${String(signal)}`, { field: "signal" });
    }
    const request = { sandboxId: this.sandbox.id, pid, signal };
    await this.conn.call(() => this.conn.actions.signalProcess(request));
  }

  /** Kills process `pid` (SIGKILL: it cannot be caught), as `sendSignal(pid, "KILL")`. It leaves `list()` once
   * its parent has reaped it (until then it shows with state `Z`); one whose parent ended is reaped by the
   * sandbox's init at once. */
  async kill(pid: number): Promise<void> {
    await this.sendSignal(pid, "KILL");
  }
}
