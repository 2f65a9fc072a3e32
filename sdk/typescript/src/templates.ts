/**
 * Templates and images of your own (docs/SANDBOXES.md): a template names a sandbox configuration once, in a
 * space (an image, default limits, env, a working directory, start-up commands, egress); an image is built from
 * a Dockerfile and a local folder, or imported from a root filesystem tarball, on the runtime's engine (there is
 * no registry; admin keys only).
 *
 *     await using templates = new Templates();
 *     const built = await templates.buildImage("./tools", "team/tools:1", { onOutput: (t) => process.stdout.write(t) });
 *     await templates.create("tools", { image: built.image, env: { MODE: "dev" }, workDir: "app",
 *                                       setupCommands: ["mkdir -p app"] });
 *     await using sb = await Sandbox.create({ template: "tools" });
 */
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import {
  BuildImageRequestSchema,
  type BuiltImage as BuiltImageMessage,
  ImportImageRequestSchema,
  type Template as TemplateMessage,
  TemplateSchema,
} from "./gen/mentis/v1/template_pb.js";
import type { Connection } from "./client.js";
import { InvalidArgument, MentisError } from "./errors.js";
import { sendStream } from "./streams.js";
import { type EgressMode, type EgressRule, egressName, egressValue, ruleOf } from "./egress.js";
import { Egress } from "./gen/mentis/v1/sandbox_pb.js";
import { ruleMessages } from "./egress.js";
import { int32, int64, str, strings } from "./args.js";
import { ServiceConnection, type ServiceOptions } from "./service.js";
import { rechunk, tarChunks } from "./transfer.js";

// Build contexts and root filesystems go in pieces of this size (each one message).
const CHUNK = 1 << 20;

/** What a template sets (every field optional: 0 / empty leaves it to the space's and the runtime's defaults). */
export interface TemplateFields {
  description?: string;
  /** The image of its sandboxes (default: the runtime's). */
  image?: string;
  /** Env of its sandboxes (a sandbox's own env goes over it). */
  env?: Record<string, string>;
  /** CPUs (fractions allowed). */
  cpu?: number;
  memoryMb?: number;
  /** Processes and threads. */
  pids?: number;
  /** Open files per process. */
  nofile?: number;
  diskMb?: number;
  /** Where shell commands that name no directory start: relative to /workspace, or absolute. */
  workDir?: string;
  /** Shell commands run in order in each new sandbox before it is handed out. */
  setupCommands?: string[];
  /** Sandboxes of it kept ready (at most 64). */
  poolSize?: number;
  /** The isolation its sandboxes run under (`runsc`), one the runtime offers; admin keys only. */
  runtimeClass?: string;
  /** Egress of its sandboxes whose spec names none (docs/EGRESS.md). */
  egress?: EgressMode;
  /** With egress `"rules"`: what its sandboxes may reach. */
  egressRules?: EgressRule[];
}

/** A sandbox configuration of a space. */
export interface Template extends Required<Omit<TemplateFields, "egress">> {
  name: string;
  space: string;
  egress: EgressMode | "unspecified";
  createdAt: Date | undefined;
  updatedAt: Date | undefined;
}

/** Changes of `Templates.update`: the fields given change (null: to the empty value), the others stay. */
export type TemplateChanges = { [K in keyof TemplateFields]?: TemplateFields[K] | null };

/** An image made on the runtime's engine, ready for a template or `Sandbox.create({ image })`. */
export interface BuiltImage {
  image: string;
  /** The engine's id of it (`sha256:...`). */
  imageId: string;
  /** The space it belongs to: only that space's keys may use it, unless it is shared. */
  space: string;
  /** Whether the admin shared it with every space (`shareImage`). */
  shared: boolean;
}

/** Options of `Templates.buildImage`. */
export interface BuildImageOptions {
  /** The Dockerfile's path in the context (default `Dockerfile`). */
  dockerfile?: string;
  /** ARG values. */
  buildArgs?: Record<string, string>;
  /** Build every step again rather than take it from the engine's cache. */
  noCache?: boolean;
  /** Called with the engine's output as it comes. */
  onOutput?: (text: string) => void;
  /** The space the image belongs to (default `"default"`). */
  space?: string;
  /** RUN steps get a route out (when the runtime allows it, MENTIS_BUILD_EGRESS=allow). */
  egress?: boolean;
  /** Aborting ends the call (and the build) and rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Options of `Templates.importImage`. */
export interface ImportImageOptions {
  /** Dockerfile instructions applied to it (`"ENV PATH=/usr/bin:/bin"`, `"WORKDIR /srv"`). */
  changes?: string[];
  /** The space the image belongs to (default `"default"`). */
  space?: string;
  /** Aborting ends the call (nothing is imported) and rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** A tar archive (plain or gzip) as bytes or a stream of bytes (a Node Readable is one). */
export type TarSource = Uint8Array | AsyncIterable<Uint8Array>;

const LIMITS = ["cpu", "memoryMb", "pids", "nofile", "diskMb"] as const;
const FIELDS: Record<keyof TemplateFields, string> = {
  description: "description",
  image: "image",
  env: "env",
  workDir: "work_dir",
  setupCommands: "setup_commands",
  poolSize: "pool_size",
  runtimeClass: "runtime_class",
  cpu: "limits",
  memoryMb: "limits",
  pids: "limits",
  nofile: "limits",
  diskMb: "limits",
  egress: "egress",
  egressRules: "egress",
};

function templateOf(t: TemplateMessage | undefined): Template {
  if (!t) throw new MentisError("the runtime's answer lacks its template");
  return {
    name: t.name,
    space: t.spaceId,
    description: t.description,
    image: t.image,
    cpu: t.limits?.cpu ?? 0,
    memoryMb: Number(t.limits?.memoryMb ?? 0),
    pids: Number(t.limits?.pids ?? 0),
    nofile: Number(t.limits?.nofile ?? 0),
    diskMb: Number(t.limits?.diskMb ?? 0),
    env: { ...t.env },
    workDir: t.workDir,
    setupCommands: [...t.setupCommands],
    poolSize: t.poolSize,
    runtimeClass: t.runtimeClass,
    egress: egressName(t.egress),
    egressRules: t.egressRules.map(ruleOf),
    createdAt: t.createTime ? timestampDate(t.createTime) : undefined,
    updatedAt: t.updateTime ? timestampDate(t.updateTime) : undefined,
  };
}

function builtOf(b: BuiltImageMessage | undefined): BuiltImage {
  if (!b) throw new MentisError("the runtime's answer lacks its image");
  return { image: b.image, imageId: b.imageId, space: b.spaceId, shared: b.shared };
}

function cpu(value: number | undefined): number {
  if (value === undefined) return 0;
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new InvalidArgument(`cpu must be a number, not ${String(value)}`, { field: "cpu" });
  }
  return value;
}

/** The Template message of `name` with `fields` (null or undefined: the empty value). */
function templateMessage(name: string, space: string | undefined, fields: TemplateChanges): TemplateMessage {
  const commands: unknown = fields.setupCommands ?? [];
  if (!Array.isArray(commands) || !commands.every((c) => typeof c === "string")) {
    throw new InvalidArgument("setupCommands must be an array of strings", { field: "setupCommands" });
  }
  return create(TemplateSchema, {
    spaceId: str(space, "space"),
    name: str(name, "name"),
    description: str(fields.description ?? undefined, "description"),
    image: str(fields.image ?? undefined, "image"),
    limits: {
      cpu: cpu(fields.cpu ?? undefined),
      memoryMb: int64(fields.memoryMb ?? undefined, "memoryMb"),
      pids: int64(fields.pids ?? undefined, "pids"),
      nofile: int64(fields.nofile ?? undefined, "nofile"),
      diskMb: int64(fields.diskMb ?? undefined, "diskMb"),
    },
    env: strings(fields.env ?? undefined, "env"),
    workDir: str(fields.workDir ?? undefined, "workDir"),
    setupCommands: commands as string[],
    poolSize: int32(fields.poolSize ?? undefined, "poolSize", 0, 0xffff_ffff),
    runtimeClass: str(fields.runtimeClass ?? undefined, "runtimeClass"),
    egress: fields.egress == null ? Egress.UNSPECIFIED : egressValue(fields.egress, "egress"),
    egressRules: ruleMessages(fields.egressRules ?? undefined, "egressRules"),
  });
}

/** The folder (or archive) to send: a path is a folder archived as it is read; bytes or a stream, a tar. */
async function contextSource(context: string | TarSource): Promise<AsyncIterable<Uint8Array> | Iterable<Uint8Array>> {
  if (typeof context === "string") {
    let st;
    try {
      st = await stat(context);
    } catch (e) {
      throw new InvalidArgument(`the build context ${context} cannot be read: ${(e as Error).message}`, {
        field: "context",
        cause: e,
      });
    }
    if (!st.isDirectory()) {
      throw new InvalidArgument(`${context} is not a folder: the build context is a folder with a Dockerfile`, {
        field: "context",
      });
    }
    return tarChunks(context, CHUNK);
  }
  return tarSource(context, "context");
}

function tarSource(source: TarSource, field: string): AsyncIterable<Uint8Array> | Iterable<Uint8Array> {
  if (source instanceof Uint8Array) {
    const pieces: Uint8Array[] = [];
    for (let at = 0; at < source.length; at += CHUNK) pieces.push(source.subarray(at, at + CHUNK));
    return pieces;
  }
  if (source && typeof (source as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] === "function") return source;
  throw new InvalidArgument(`${field} must be a path, a Uint8Array or an async iterable of bytes`, { field });
}

/**
 * The templates of the runtime's spaces (`create`, `get`, `list`, `update`, `delete`) and the images they name
 * (`buildImage`, `importImage`, `shareImage`). It opens a connection of its own at its first call (the same
 * options and defaults as `Sandbox.create`), or uses the one it is given; `close()` (or `await using`) closes
 * its own. `space` unset is the space `default`; a key scoped to spaces manages its spaces' templates only, and
 * images are made by admin keys only (PermissionDenied).
 */
export class Templates {
  private readonly conn: ServiceConnection;

  constructor(options: ServiceOptions | Connection = {}) {
    this.conn = new ServiceConnection(options, "Templates");
  }

  /** Creates template `name` (1-63 lowercase letters, digits or '-') and returns it. AlreadyExists when the space
   * has one of that name, NotFound when the space is unknown, InvalidArgument (with its field) for a value the
   * runtime refuses. */
  async create(name: string, fields: TemplateFields & { space?: string } = {}): Promise<Template> {
    const template = templateMessage(name, fields.space, fields);
    const r = await this.conn.call((c) => c.templates.createTemplate({ template }));
    return templateOf(r.template);
  }

  /** One template; NotFound when the space has none of that name. */
  async get(name: string, options: { space?: string } = {}): Promise<Template> {
    const request = { spaceId: str(options.space, "space"), name: str(name, "name") };
    const r = await this.conn.call((c) => c.templates.getTemplate(request));
    return templateOf(r.template);
  }

  /** The space's templates in name order, every page (`pageSize` per call; default the runtime's, 100). */
  async list(options: { space?: string; pageSize?: number } = {}): Promise<Template[]> {
    const request = { spaceId: str(options.space, "space"), pageSize: int32(options.pageSize, "pageSize", -0x8000_0000) };
    const found: Template[] = [];
    let pageToken = "";
    do {
      const r = await this.conn.call((c) => c.templates.listTemplates({ ...request, pageToken }));
      found.push(...r.templates.map(templateOf));
      pageToken = r.nextPageToken;
    } while (pageToken);
    return found;
  }

  /** Changes the fields given, and only those (null: to the empty value), and returns the template:
   * `update("tools", { image: "team/tools:2" })`. The runtime changes the limits together (and egress with its
   * rules): when only some are given, the template is read first and the others sent as they were. Sandboxes
   * made before keep what they got. NotFound when there is no such template; InvalidArgument for a field that is
   * none of a template's, or none at all. */
  async update(name: string, changes: TemplateChanges, options: { space?: string } = {}): Promise<Template> {
    if (typeof changes !== "object" || changes === null) {
      throw new InvalidArgument("changes must be an object of template fields", { field: "changes" });
    }
    const given = Object.keys(changes).filter((k) => changes[k as keyof TemplateChanges] !== undefined);
    const unknown = given.filter((k) => !(k in FIELDS));
    if (unknown.length) {
      throw new InvalidArgument(`update cannot change ${unknown.join(", ")}; it changes ${Object.keys(FIELDS).join(", ")}`, {
        field: unknown[0],
      });
    }
    if (!given.length) {
      throw new InvalidArgument(`update needs at least one field to change: ${Object.keys(FIELDS).join(", ")}`, {
        field: "changes",
      });
    }
    const has = (k: keyof TemplateFields) => given.includes(k);
    const someLimits = LIMITS.filter(has).length;
    const needsCurrent = (someLimits > 0 && someLimits < LIMITS.length) || has("egress") !== has("egressRules");
    let fields: TemplateChanges = changes;
    if (needsCurrent) {
      const current = await this.get(name, options);
      const kept: TemplateChanges = {};
      if (someLimits) for (const k of LIMITS) kept[k] = current[k];
      if (has("egress") || has("egressRules")) {
        kept.egress = current.egress === "unspecified" ? null : current.egress;
        kept.egressRules = current.egressRules;
      }
      fields = { ...kept, ...Object.fromEntries(given.map((k) => [k, changes[k as keyof TemplateChanges]])) };
    }
    const paths = [...new Set(given.map((k) => FIELDS[k as keyof TemplateFields]))];
    const template = templateMessage(name, options.space, fields);
    const r = await this.conn.call((c) => c.templates.updateTemplate({ template, updateMask: { paths } }));
    return templateOf(r.template);
  }

  /** Deletes a template; sandboxes made from it keep running. NotFound when there is none. */
  async delete(name: string, options: { space?: string } = {}): Promise<void> {
    const request = { spaceId: str(options.space, "space"), name: str(name, "name") };
    await this.conn.call((c) => c.templates.deleteTemplate(request));
  }

  /**
   * Builds image `tag` (`"team/tools:1"`) on the runtime's engine from `context`: a folder, sent as a tar archive
   * as it is read (every file of it: a `.dockerignore` is not applied), or a tar archive of one (bytes or a
   * stream). The engine's output goes to `onOutput` as it comes. Every FROM must name an image the engine has:
   * FailedPrecondition before the build otherwise, and for a step that fails, after its output. A context that
   * cannot be read cancels the call (nothing is built) and its error is thrown, as is the callback's.
   */
  async buildImage(context: string | TarSource, tag: string, options: BuildImageOptions = {}): Promise<BuiltImage> {
    const header = {
      image: str(tag, "tag"),
      dockerfile: str(options.dockerfile, "dockerfile"),
      buildArgs: strings(options.buildArgs, "buildArgs"),
      noCache: options.noCache === true,
      spaceId: str(options.space, "space"),
      egress: options.egress === true,
    };
    const pieces = await contextSource(context);
    const conn = await this.conn.get();
    let callback: { error: unknown } | undefined;
    let image: BuiltImage | undefined;
    try {
      await sendStream(
        async (requests, signal) => {
          for await (const r of conn.templates.buildImage(requests, { signal })) {
            if (r.kind.case === "output") {
              try {
                options.onOutput?.(r.kind.value);
              } catch (e) {
                callback = { error: e };
                throw e;
              }
            } else if (r.kind.case === "image") {
              image = builtOf(r.kind.value);
            }
          }
        },
        create(BuildImageRequestSchema, { kind: { case: "header", value: header } }),
        rechunk(pieces, CHUNK),
        (data) => create(BuildImageRequestSchema, { kind: { case: "context", value: data } }),
        options.signal,
      );
    } catch (e) {
      // The callback's own error, as it threw it (not as a failure of the call).
      throw callback ? callback.error : e;
    }
    if (!image) throw new MentisError("the build's stream ended without an image");
    return image;
  }

  /** Makes image `tag` on the runtime's engine from a root filesystem as a tar archive (plain or gzip), as
   * `docker import` does: `rootfs` is the archive's path, its bytes, or a stream of them. `changes` are
   * Dockerfile instructions applied to it (CMD, ENTRYPOINT, ENV, EXPOSE, LABEL, ONBUILD, USER, VOLUME, WORKDIR).
   * An archive that cannot be read cancels the call (nothing is imported) and its error is thrown. */
  async importImage(rootfs: string | TarSource, tag: string, options: ImportImageOptions = {}): Promise<BuiltImage> {
    const changes: unknown = options.changes ?? [];
    if (!Array.isArray(changes) || !changes.every((c) => typeof c === "string")) {
      throw new InvalidArgument("changes must be an array of strings", { field: "changes" });
    }
    const header = { image: str(tag, "tag"), changes: changes as string[], spaceId: str(options.space, "space") };
    let pieces: AsyncIterable<Uint8Array> | Iterable<Uint8Array>;
    if (typeof rootfs === "string") {
      let st;
      try {
        st = await stat(rootfs);
      } catch (e) {
        throw new InvalidArgument(`${rootfs} cannot be read: ${(e as Error).message}`, { field: "rootfs", cause: e });
      }
      if (st.isDirectory()) {
        throw new InvalidArgument(`${rootfs} is a folder: importImage takes a root filesystem as a tar file`, {
          field: "rootfs",
        });
      }
      pieces = createReadStream(rootfs, { highWaterMark: CHUNK });
    } else {
      pieces = tarSource(rootfs, "rootfs");
    }
    const conn = await this.conn.get();
    try {
      const r = await sendStream(
        (requests, signal) => conn.templates.importImage(requests, { signal }),
        create(ImportImageRequestSchema, { kind: { case: "header", value: header } }),
        rechunk(pieces, CHUNK),
        (data) => create(ImportImageRequestSchema, { kind: { case: "data", value: data } }),
        options.signal,
      );
      return builtOf(r.image);
    } finally {
      if (typeof rootfs === "string") (pieces as ReturnType<typeof createReadStream>).destroy();
    }
  }

  /** Lets every space's keys use image `tag` (one built or imported for a space), or, with `shared: false`, only
   * its own space's again. Admin keys only. */
  async shareImage(tag: string, shared = true): Promise<BuiltImage> {
    const request = { image: str(tag, "tag"), shared: shared === true };
    const r = await this.conn.call((c) => c.templates.shareImage(request));
    return builtOf(r.image);
  }

  /** Closes the connection (when it is this object's own). */
  async close(): Promise<void> {
    await this.conn.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
