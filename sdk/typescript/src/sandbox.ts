/**
 * A sandbox: create one (or connect to one), run shell commands and IPython cells in it, reach its files,
 * terminals and processes, snapshot it, preview its ports, and delete it.
 *
 *     await using sb = await Sandbox.create();
 *     console.log((await sb.run("echo hi")).stdout);
 *     console.log((await sb.runCode("6 * 7")).results[0]?.text);
 */
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import {
  Egress,
  type Sandbox as SandboxMessage,
  type SandboxSpec,
  SandboxSpecSchema,
  SandboxState,
} from "./gen/mentis/v1/sandbox_pb.js";
import { Connection, type ConnectionOptions } from "./client.js";
import { AlreadyExists, FailedPrecondition, InvalidArgument, MentisError, NotFound } from "./errors.js";
import {
  CellCollector,
  type CellResult,
  CommandCollector,
  type CommandResult,
  cellAction,
  observations,
  type RunCodeOptions,
  type RunOptions,
  shellAction,
  submit,
  wholeSeconds,
} from "./actions.js";
import type { Action } from "./gen/mentis/v1/action_pb.js";
import { Files } from "./files.js";
import { int32, int64 } from "./args.js";
import { Processes } from "./processes.js";
import { Terminals } from "./terminals.js";
import { createSnapshot, type Snapshot, type SnapshotOptions } from "./snapshots.js";
import {
  denialOf,
  type EgressDenial,
  type EgressMode,
  type EgressRule,
  egressName,
  egressValue,
  modeRequest,
  ruleMessages,
  ruleOf,
  rulesRequest,
} from "./egress.js";

export type { EgressMode, EgressRule } from "./egress.js";

/** A sandbox's state, lower case: `"running"`, `"paused"`, ... */
export type SandboxStateName = Lowercase<keyof typeof SandboxState>;
/** What a new sandbox is made of. */
export interface SandboxCreateOptions extends ConnectionOptions {
  /** A template by name (docs/SANDBOXES.md): its image, limits, env and files. */
  template?: string;
  /** An image of this engine (default: the runtime's). */
  image?: string;
  /** Start from a snapshot's workspace (`Snapshot.id`). */
  snapshotId?: string;
  env?: Record<string, string>;
  labels?: Record<string, string>;
  /** The space the sandbox lives in (default: the key's). */
  space?: string;
  /** A name of yours, unique in the space: `Sandbox.getOrCreate` finds the sandbox by it. */
  key?: string;
  /** CPUs (fractions allowed). */
  cpu?: number;
  memoryMb?: number;
  diskMb?: number;
  pidsLimit?: number;
  /** After this long without activity the sandbox is paused (rounded up to whole seconds). */
  idleTimeoutMs?: number;
  /** The sandbox is deleted after this long, whatever it does (rounded up to whole seconds). */
  maxLifetimeMs?: number;
  egress?: EgressMode;
  egressRules?: EgressRule[];
  /** `await using` and `Symbol.asyncDispose` leave the sandbox running instead of deleting it. */
  keep?: boolean;
}

/** A sandbox as `Sandbox.list` and `Sandbox.info` describe it. */
export interface SandboxInfo {
  id: string;
  state: SandboxStateName;
  stateReason: string;
  space: string;
  image: string;
  template: string;
  labels: Record<string, string>;
  key: string;
  workDir: string;
  cpu: number;
  memoryMb: number;
  egress: EgressMode | "unspecified";
  egressRules: EgressRule[];
  createdAt: Date | undefined;
  lastActivityAt: Date | undefined;
  /** The seq of the newest observation in the sandbox's log. */
  lastSeq: bigint;
}

/** A URL that reaches one port of the sandbox through the runtime's HTTP listener (docs/PREVIEW.md). */
export interface PreviewUrl {
  /** The whole URL, with the token as `?mentis_preview_token=`. */
  url: string;
  /** The token alone (programs may send it as the `X-Mentis-Preview-Token` header instead). */
  token: string;
  /** The URL's path, for a client that reaches the runtime by another address. */
  path: string;
  expiresAt: Date | undefined;
}

function stateName(state: SandboxState): SandboxStateName {
  return (SandboxState[state] ?? "UNSPECIFIED").toLowerCase() as SandboxStateName;
}

export function sandboxInfo(m: SandboxMessage): SandboxInfo {
  return {
    id: m.sandboxId,
    state: stateName(m.state),
    stateReason: m.stateReason,
    space: m.spaceId,
    image: m.image,
    template: m.template,
    labels: { ...m.labels },
    key: m.externalKey,
    workDir: m.workDir,
    cpu: m.cpuLimit,
    memoryMb: Number(m.memoryLimitMb),
    egress: egressName(m.egress),
    egressRules: m.egressRules.map(ruleOf),
    createdAt: m.createTime ? timestampDate(m.createTime) : undefined,
    lastActivityAt: m.lastActivityTime ? timestampDate(m.lastActivityTime) : undefined,
    lastSeq: m.lastSeq,
  };
}

function spec(options: SandboxCreateOptions): SandboxSpec {
  return create(SandboxSpecSchema, {
    spaceId: options.space ?? "",
    externalKey: options.key ?? "",
    image: options.image ?? "",
    template: options.template ?? "",
    snapshotId: options.snapshotId ?? "",
    env: options.env ?? {},
    labels: options.labels ?? {},
    cpuLimit: options.cpu ?? 0,
    memoryLimitMb: int64(options.memoryMb, "memoryMb"),
    diskLimitMb: int64(options.diskMb, "diskMb"),
    pidsLimit: int64(options.pidsLimit, "pidsLimit"),
    idleTimeoutSeconds: wholeSeconds(options.idleTimeoutMs, "idleTimeoutMs"),
    maxLifetimeSeconds: wholeSeconds(options.maxLifetimeMs, "maxLifetimeMs"),
    egress: options.egress === undefined ? Egress.UNSPECIFIED : egressValue(options.egress, "egress"),
    egressRules: ruleMessages(options.egressRules, "egressRules"),
  });
}

/** Options of `Sandbox.list`. */
export interface ListSandboxesOptions extends ConnectionOptions {
  space?: string;
  /** Only sandboxes with every one of these labels. */
  labels?: Record<string, string>;
  /** Only sandboxes in these states. */
  state?: SandboxStateName | SandboxStateName[];
  /** Sandboxes asked for per call (default: the runtime's). */
  pageSize?: number;
  /** At most this many (default: all). */
  limit?: number;
}

function detached(actionId: string): FailedPrecondition {
  return new FailedPrecondition(
    `command ${actionId} was detached before its end (it runs on: attachCommand(${JSON.stringify(actionId)}))`,
  );
}

/**
 * A command running in the background (`run(..., { background: true })`, `attachCommand`): its output goes to
 * the callbacks as it comes, `wait()` gives its result, `kill()` cancels it, `detach()` stops following it
 * (it runs on).
 */
export class CommandHandle {
  private readonly follow = new AbortController();
  private readonly done: Promise<CommandResult>;
  private opened!: () => void;
  /** Resolves at the stream's first message. */
  readonly started: Promise<void>;

  constructor(
    private readonly conn: Connection,
    private readonly sandboxId: string,
    action: Action | undefined,
    /** The command's action id: `attachCommand` follows it again, from this process or another. */
    readonly actionId: string,
    onStdout: ((text: string) => void) | undefined,
    onStderr: ((text: string) => void) | undefined,
  ) {
    this.started = new Promise((resolve) => (this.opened = resolve));
    const collect = new CommandCollector(onStdout, onStderr);
    this.done = (async () => {
      for await (const obs of observations(conn, sandboxId, action, actionId, {
        signal: this.follow.signal,
        onOpen: () => this.opened(),
      })) {
        collect.feed(obs);
      }
      return collect.result(actionId);
    })().catch((e: unknown) => {
      if (this.follow.signal.aborted) throw detached(actionId);
      throw e;
    });
    // A failure is the caller's through wait(); an unhandled rejection would end the process.
    this.done.catch(() => undefined);
  }

  /** The command's result, once it ended. */
  wait(): Promise<CommandResult> {
    return this.done;
  }

  /** Cancels the command in the sandbox (its result's reason is then `"cancelled"`). */
  async kill(): Promise<void> {
    await this.conn.call(() => this.conn.actions.cancelAction({ sandboxId: this.sandboxId, actionId: this.actionId }));
  }

  /** Stops following the command: it runs on, `wait()` rejects with FailedPrecondition. */
  async detach(): Promise<void> {
    this.follow.abort(detached(this.actionId));
    await this.done.catch(() => undefined);
  }
}

/** A sandbox of the runtime, and the connection this object reaches it by. */
export class Sandbox {
  private info_: SandboxMessage;
  private readonly commands = new Set<CommandHandle>();
  /** The sandbox's files: read, write, list, upload, download, watch. */
  readonly files: Files = new Files(this);
  /** The sandbox's terminals: open, attach, write, resize, signal. */
  readonly terminals: Terminals = new Terminals(this);
  /** The sandbox's processes: list and signal. */
  readonly processes: Processes = new Processes(this);

  protected constructor(
    /** The connection (and the generated clients): for calls this class does not wrap. */
    readonly connection: Connection,
    info: SandboxMessage,
    private readonly owned: boolean,
    private readonly keep: boolean,
  ) {
    this.info_ = info;
  }

  /** Creates a sandbox. `await using sb = await Sandbox.create()` deletes it at the block's end (unless `keep`). */
  static async create(options: SandboxCreateOptions = {}): Promise<Sandbox> {
    const request = { spec: spec(options) };
    const conn = await Connection.open(options);
    try {
      const r = await conn.call(() => conn.sandboxes.createSandbox(request));
      return new Sandbox(conn, required(r.sandbox), true, options.keep ?? false);
    } catch (e) {
      conn.close();
      throw e;
    }
  }

  /** A sandbox that exists, by id (NotFound, reason SANDBOX_NOT_FOUND, when none has it). Disposing of it
   * closes the connection and leaves the sandbox. */
  static async connect(sandboxId: string, options: ConnectionOptions = {}): Promise<Sandbox> {
    const conn = await Connection.open(options);
    try {
      const r = await conn.call(() => conn.sandboxes.getSandbox({ sandboxId }));
      return new Sandbox(conn, required(r.sandbox), false, true);
    } catch (e) {
      conn.close();
      throw e;
    }
  }

  /** The sandbox with `key` in the space, created with `options` when there is none (also when two clients ask
   * at once: one creates it, both get it). Disposing of it leaves the sandbox. */
  static async getOrCreate(options: SandboxCreateOptions & { key: string }): Promise<Sandbox> {
    if (!options.key) throw new InvalidArgument("getOrCreate needs a key", { field: "key" });
    const request = { spec: spec(options) };
    const conn = await Connection.open(options);
    try {
      for (let attempt = 0; attempt < 3; attempt++) {
        try {
          const r = await conn.call(() =>
            conn.sandboxes.getSandboxByKey({ spaceId: options.space ?? "", externalKey: options.key }),
          );
          return new Sandbox(conn, required(r.sandbox), false, true);
        } catch (e) {
          if (!(e instanceof NotFound)) throw e;
        }
        try {
          const r = await conn.call(() => conn.sandboxes.createSandbox(request));
          return new Sandbox(conn, required(r.sandbox), false, true);
        } catch (e) {
          if (!(e instanceof AlreadyExists)) throw e;
        }
      }
      throw new MentisError(`no sandbox with key ${JSON.stringify(options.key)} could be found or created`);
    } catch (e) {
      conn.close();
      throw e;
    }
  }

  /** The sandboxes the key may see, oldest first, across every page (at most `limit`). */
  static async list(options: ListSandboxesOptions = {}): Promise<SandboxInfo[]> {
    const states = options.state === undefined ? [] : Array.isArray(options.state) ? options.state : [options.state];
    const stateValues = states.map((s) => {
      const value = SandboxState[s.toUpperCase() as keyof typeof SandboxState];
      if (value === undefined) throw new InvalidArgument(`no sandbox state is called ${JSON.stringify(s)}`, { field: "state" });
      return value;
    });
    const conn = await Connection.open(options);
    const found: SandboxInfo[] = [];
    let pageToken = "";
    try {
      do {
        const r = await conn.call(() =>
          conn.sandboxes.listSandboxes({
            spaceId: options.space ?? "",
            labels: options.labels ?? {},
            states: stateValues,
            pageSize: options.pageSize ?? 0,
            pageToken,
          }),
        );
        found.push(...r.sandboxes.map(sandboxInfo));
        if (options.limit && found.length >= options.limit) return found.slice(0, options.limit);
        pageToken = r.nextPageToken;
      } while (pageToken);
      return found;
    } finally {
      conn.close();
    }
  }

  get id(): string {
    return this.info_.sandboxId;
  }

  /** The state when this object last heard of it (`refresh()` asks again). */
  get state(): SandboxStateName {
    return stateName(this.info_.state);
  }

  /** Everything the runtime said of the sandbox when this object last heard of it. */
  get info(): SandboxInfo {
    return sandboxInfo(this.info_);
  }

  /** The directory commands start in and relative file paths are under. */
  get workDir(): string {
    return this.info_.workDir;
  }

  toString(): string {
    return `Sandbox(${this.id}, ${this.state})`;
  }

  async refresh(): Promise<this> {
    const r = await this.connection.call(() => this.connection.sandboxes.getSandbox({ sandboxId: this.id }));
    this.info_ = required(r.sandbox);
    return this;
  }

  /** Pauses the sandbox (its processes are frozen, its memory kept). */
  async pause(): Promise<this> {
    const r = await this.connection.call(() => this.connection.sandboxes.pauseSandbox({ sandboxId: this.id }));
    this.info_ = required(r.sandbox);
    return this;
  }

  async resume(): Promise<this> {
    const r = await this.connection.call(() => this.connection.sandboxes.resumeSandbox({ sandboxId: this.id }));
    this.info_ = required(r.sandbox);
    return this;
  }

  /** Deletes the sandbox; false when it was not there to delete. */
  async delete(): Promise<boolean> {
    const r = await this.connection.call(() => this.connection.sandboxes.deleteSandbox({ sandboxId: this.id }));
    return r.found;
  }

  /** Closes the connection: the sandbox stays, and so do its background commands and terminals (they are
   * detached) and its file watches (their readers here are closed). */
  async close(): Promise<void> {
    try {
      await Promise.all([
        ...[...this.commands].map((c) => c.detach()),
        this.terminals.detachAll(),
        this.files.closeWatches(),
      ]);
    } finally {
      this.connection.close();
    }
  }

  /** `await using`: deletes the sandbox this object created (unless `keep`), then closes the connection. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      if (this.owned && !this.keep) await this.delete();
    } finally {
      await this.close();
    }
  }

  /** Runs a shell command and returns how it ended (a failing command is a result, not an error). With
   * `background: true`, returns a handle once the runtime accepted the command. */
  run(command: string, options?: RunOptions & { background?: false }): Promise<CommandResult>;
  run(command: string, options: Omit<RunOptions, "signal"> & { background: true }): Promise<CommandHandle>;
  async run(
    command: string,
    options: RunOptions & { background?: boolean } = {},
  ): Promise<CommandResult | CommandHandle> {
    const action = shellAction(command, options);
    const actionId = randomUUID();
    if (options.background) {
      await submit(this.connection, this.id, action, actionId);
      return this.track(new CommandHandle(this.connection, this.id, action, actionId, options.onStdout, options.onStderr));
    }
    const collect = new CommandCollector(options.onStdout, options.onStderr);
    await this.follow(action, actionId, options.signal, (obs) => collect.feed(obs));
    return collect.result(actionId);
  }

  /** A command of this sandbox by its action id, running or ended, from this process or another: its output
   * from its start goes to the callbacks, then what follows as it comes. NotFound (ACTION_NOT_FOUND) for an id
   * the sandbox does not know. Resolves at the stream's first message. */
  async attachCommand(
    actionId: string,
    options: { onStdout?: (text: string) => void; onStderr?: (text: string) => void } = {},
  ): Promise<CommandHandle> {
    if (!actionId) throw new InvalidArgument("actionId must name a command", { field: "actionId" });
    const handle = this.track(new CommandHandle(this.connection, this.id, undefined, actionId, options.onStdout, options.onStderr));
    await Promise.race([handle.started, handle.wait()]);
    return handle;
  }

  /** Runs an IPython cell in the sandbox's kernel (state carries over between cells). */
  async runCode(code: string, options: RunCodeOptions = {}): Promise<CellResult> {
    const action = cellAction(code, options);
    const actionId = randomUUID();
    const collect = new CellCollector(options.onOutput);
    await this.follow(action, actionId, options.signal, (obs) => collect.feed(obs));
    return collect.result(actionId);
  }

  /** Takes a snapshot of the workspace (docs/SNAPSHOTS.md) and returns it once complete:
   * `Sandbox.create({ snapshotId })` brings it back in a new sandbox. */
  async snapshot(options: SnapshotOptions = {}): Promise<Snapshot> {
    return createSnapshot(this.connection, this.id, options);
  }

  /** Gives the sandbox these egress rules (its mode stays; docs/EGRESS.md) and returns them as the runtime
   * keeps them (a rule with no ports gets 80 and 443). In force for its next connection. */
  async updateEgressRules(rules: EgressRule[]): Promise<EgressRule[]> {
    const request = rulesRequest(this.id, rules);
    const r = await this.connection.call(() => this.connection.sandboxes.updateSandbox(request));
    this.info_ = required(r.sandbox);
    return this.info.egressRules;
  }

  /** Gives a RUNNING sandbox another egress mode, and these rules (none unless the mode is `"rules"`). */
  async updateEgress(mode: EgressMode, rules?: EgressRule[]): Promise<this> {
    const request = modeRequest(this.id, mode, rules);
    const r = await this.connection.call(() => this.connection.sandboxes.updateSandbox(request));
    this.info_ = required(r.sandbox);
    return this;
  }

  /** The connections and names the egress gateway refused the sandbox lately, newest last. */
  async egressDenials(): Promise<EgressDenial[]> {
    const r = await this.connection.call(() => this.connection.sandboxes.listEgressDenials({ sandboxId: this.id }));
    return r.denials.map(denialOf);
  }

  /** A preview URL for `port` (docs/PREVIEW.md), valid for `ttlMs` (default: the runtime's). */
  async previewUrl(port: number, options: { ttlMs?: number } = {}): Promise<PreviewUrl> {
    const r = await this.connection.call(() =>
      this.connection.sandboxes.getPreviewUrl({
        sandboxId: this.id,
        port: int32(port, "port", 0, 0xffff_ffff),
        ttlSeconds: wholeSeconds(options.ttlMs, "ttlMs"),
      }),
    );
    return { url: r.url, token: r.token, path: r.path, expiresAt: r.expireTime ? timestampDate(r.expireTime) : undefined };
  }

  /** Revokes the preview URLs of `port` (every port when none is given). */
  async revokePreviewUrls(port?: number): Promise<void> {
    const request = { sandboxId: this.id, port: int32(port, "port", 1, 0xffff_ffff) };
    await this.connection.call(() => this.connection.sandboxes.revokePreviewUrls(request));
  }

  private track(handle: CommandHandle): CommandHandle {
    this.commands.add(handle);
    const forget = () => this.commands.delete(handle);
    handle.wait().then(forget, forget);
    return handle;
  }

  /** Follows an action to its end; the caller's abort cancels it in the sandbox, then rejects. */
  private async follow(
    action: Action,
    actionId: string,
    signal: AbortSignal | undefined,
    feed: (obs: import("./gen/mentis/v1/observation_pb.js").Observation) => void,
  ): Promise<void> {
    try {
      for await (const obs of observations(this.connection, this.id, action, actionId, { signal })) {
        feed(obs);
      }
    } catch (e) {
      if (signal?.aborted) {
        await this.connection
          .call(() => this.connection.actions.cancelAction({ sandboxId: this.id, actionId }))
          .catch(() => undefined);
      }
      throw e;
    }
  }
}

function required<T>(value: T | undefined): T {
  if (value === undefined) throw new MentisError("the runtime's answer lacks its sandbox");
  return value;
}
