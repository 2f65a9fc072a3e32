/**
 * Snapshots of workspaces (docs/SNAPSHOTS.md): `/workspace` as a compressed archive in the runtime's snapshot
 * store, brought back in a new sandbox by `Sandbox.create({ snapshotId })`.
 *
 *     const snap = await sb.snapshot({ labels: { conversation: "chat-1" } });
 *     await using again = await Sandbox.create({ snapshotId: snap.id });
 *     await using snapshots = new Snapshots();
 *     console.log(await snapshots.list({ labels: { conversation: "chat-1" } }));
 *
 * A snapshot belongs to the space of the sandbox it was taken from and restores only there.
 */
import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { Snapshot as SnapshotMessage } from "./gen/mentis/v1/snapshot_pb.js";
import type { Connection } from "./client.js";
import { InvalidArgument, MentisError } from "./errors.js";
import { int32, str, strings } from "./args.js";
import { ServiceConnection, type ServiceOptions } from "./service.js";

// ListSnapshots' own cap on a page.
const MAX_PAGE = 1000;

/** A snapshot of a sandbox's workspace. */
export interface Snapshot {
  id: string;
  /** The sandbox it was taken from (which may be gone since). */
  sandboxId: string;
  space: string;
  labels: Record<string, string>;
  createdAt: Date | undefined;
  /** Bytes of the compressed archive in the store. */
  sizeBytes: number;
  /** Bytes of the tar archive before compression. */
  archiveBytes: number;
  /** SHA-256 of the compressed archive (hex), checked when it is restored. */
  sha256: string;
  /** Where it is kept: `"local"` or `"s3"`. */
  store: string;
}

/** Options of `sb.snapshot()` and `Snapshots.create`. */
export interface SnapshotOptions {
  labels?: Record<string, string>;
  /** Aborting ends the call (the snapshot is not made) and rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Options of `Snapshots.list`. */
export interface ListSnapshotsOptions {
  /** Only snapshots of this sandbox. */
  sandboxId?: string;
  /** Only snapshots of this space. */
  space?: string;
  /** Only snapshots carrying every one of these labels. */
  labels?: Record<string, string>;
  /** Snapshots asked for per call (default: the runtime's, 100; at most 1000). */
  pageSize?: number;
  /** At most this many (default: all): `limit: 1` is the latest. */
  limit?: number;
}

/** @internal */
export function snapshotOf(m: SnapshotMessage | undefined): Snapshot {
  if (!m) throw new MentisError("the runtime's answer lacks its snapshot");
  return {
    id: m.snapshotId,
    sandboxId: m.sandboxId,
    space: m.spaceId,
    labels: { ...m.labels },
    createdAt: m.createTime ? timestampDate(m.createTime) : undefined,
    sizeBytes: Number(m.sizeBytes),
    archiveBytes: Number(m.archiveBytes),
    sha256: m.sha256,
    store: m.store,
  };
}

/** @internal Takes a snapshot of sandbox `sandboxId` (what `Sandbox.snapshot` and `Snapshots.create` do). */
export async function createSnapshot(conn: Connection, sandboxId: string, options: SnapshotOptions): Promise<Snapshot> {
  const request = { sandboxId: str(sandboxId, "sandboxId"), labels: strings(options.labels, "labels") };
  try {
    const r = await conn.call(() => conn.snapshots.createSnapshot(request, { signal: options.signal }));
    return snapshotOf(r.snapshot);
  } catch (e) {
    if (options.signal?.aborted) throw options.signal.reason;
    throw e;
  }
}

/**
 * The runtime's snapshots: `create`, `get`, `list`, `delete`. It opens a connection of its own at its first call
 * (the same options and defaults as `Sandbox.create`), or uses the one it is given (`sb.connection`, as the
 * argument or its `connection` option).
 * `close()` (or `await using`) closes its own.
 */
export class Snapshots {
  private readonly conn: ServiceConnection;

  constructor(options: ServiceOptions | Connection = {}) {
    this.conn = new ServiceConnection(options, "Snapshots");
  }

  /** Takes a snapshot of sandbox `sandboxId`'s workspace (RUNNING, or PAUSED with auto-resume) and returns it
   * once complete. */
  async create(sandboxId: string, options: SnapshotOptions = {}): Promise<Snapshot> {
    return createSnapshot(await this.conn.get(), sandboxId, options);
  }

  /** One snapshot; NotFound (SNAPSHOT_NOT_FOUND) when there is none. */
  async get(snapshotId: string): Promise<Snapshot> {
    const id = str(snapshotId, "snapshotId");
    const r = await this.conn.call((c) => c.snapshots.getSnapshot({ snapshotId: id }));
    return snapshotOf(r.snapshot);
  }

  /** Snapshots, newest first, across every page (at most `limit`). */
  async list(options: ListSnapshotsOptions = {}): Promise<Snapshot[]> {
    const limit = options.limit ?? 0;
    if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 0) {
      throw new InvalidArgument(`limit must be 0 (no limit) or more, not ${String(limit)}`, { field: "limit" });
    }
    let pageSize = int32(options.pageSize, "pageSize", -0x8000_0000);
    if (!pageSize && limit) pageSize = Math.min(limit, MAX_PAGE);
    const request = {
      sandboxId: str(options.sandboxId, "sandboxId"),
      spaceId: str(options.space, "space"),
      labels: strings(options.labels, "labels"),
      pageSize,
    };
    const found: Snapshot[] = [];
    let pageToken = "";
    do {
      const r = await this.conn.call((c) => c.snapshots.listSnapshots({ ...request, pageToken }));
      found.push(...r.snapshots.map(snapshotOf));
      if (limit && found.length >= limit) return found.slice(0, limit);
      pageToken = r.nextPageToken;
    } while (pageToken);
    return found;
  }

  /** Deletes a snapshot and its archive; one already gone is no error. */
  async delete(snapshotId: string): Promise<void> {
    const id = str(snapshotId, "snapshotId");
    await this.conn.call((c) => c.snapshots.deleteSnapshot({ snapshotId: id }));
  }

  /** Closes the connection (when it is this object's own). */
  async close(): Promise<void> {
    await this.conn.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
