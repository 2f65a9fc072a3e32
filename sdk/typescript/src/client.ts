/**
 * The connection to a runtime: where it is, the key every call carries, TLS, and the generated clients.
 *
 * Address: the `addr` option, else `MENTIS_ADDR` (`host:port`, `http://host:port`, or `https://host:port` for
 * TLS), else a runtime the SDK starts for this process (embedded mode, see `embedded.ts`). Key: `apiKey`, else
 * `MENTIS_API_KEY`, else the admin key file `$MENTIS_DATA_DIR/admin.key` when it is readable
 * (`MENTIS_DATA_DIR` defaults to `mentis-data`, as the runtime's does), else none. The same rules as the Python
 * SDK and the `mentis` command line (docs/CLI.md).
 */
import { readFileSync } from "node:fs";
import type { ClientHttp2Stream } from "node:http2";
import { join } from "node:path";
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { ActionService } from "./gen/mentis/v1/action_pb.js";
import { FileService } from "./gen/mentis/v1/file_pb.js";
import { SandboxService } from "./gen/mentis/v1/sandbox_pb.js";
import { SnapshotService } from "./gen/mentis/v1/snapshot_pb.js";
import { SpaceService } from "./gen/mentis/v1/space_pb.js";
import { TemplateService } from "./gen/mentis/v1/template_pb.js";
import { TerminalService } from "./gen/mentis/v1/terminal_pb.js";
import { ConfigError } from "./errors.js";
import { streamError } from "./streams.js";
import { ensureEmbedded } from "./embedded.js";

/** Where the runtime is and how to reach it: every constructor that connects takes these. */
export interface ConnectionOptions {
  /** `host:port`, `http://host:port` or `https://host:port`; default `MENTIS_ADDR`, else embedded mode. */
  addr?: string;
  /** The API key; default `MENTIS_API_KEY`, else `$MENTIS_DATA_DIR/admin.key` when readable. */
  apiKey?: string;
  /** TLS; default: the address's scheme (`https://`). */
  tls?: boolean;
  /** PEM certificates to trust for TLS, beside the system's. */
  ca?: string | Buffer;
}

/** The settings a connection is made with, once every default is applied. */
export interface Settings {
  /** `host:port`. */
  target: string;
  tls: boolean;
  apiKey: string | undefined;
  ca: string | Buffer | undefined;
}

// Messages up to the runtime's own bound (MENTIS_MAX_MESSAGE_BYTES' default is 16 MiB) and beyond.
const MAX_MESSAGE = 64 * 1024 * 1024;

/** Every default applied to `options` (starting the embedded runtime when no address is configured). */
export async function resolveSettings(options: ConnectionOptions = {}): Promise<Settings> {
  const raw = options.addr || process.env.MENTIS_ADDR;
  if (!raw) {
    const embedded = await ensureEmbedded();
    return { target: embedded.addr, tls: false, apiKey: options.apiKey ?? embedded.key, ca: undefined };
  }
  const [target, schemeTls] = parseAddr(raw);
  const apiKey = options.apiKey ?? (process.env.MENTIS_API_KEY || adminKey());
  return { target, tls: options.tls ?? schemeTls, apiKey: apiKey || undefined, ca: options.ca };
}

/** `host:port` and whether the scheme asked for TLS. */
export function parseAddr(raw: string): [string, boolean] {
  const addr = raw.trim();
  for (const [scheme, tls] of [
    ["https://", true],
    ["http://", false],
  ] as const) {
    if (addr.startsWith(scheme)) {
      const host = addr.slice(scheme.length).replace(/\/+$/, "");
      if (host.includes("/")) {
        throw new ConfigError(`address ${JSON.stringify(raw)} has a path; give scheme://host:port`);
      }
      const hasPort = /:\d+$/.test(host.split("]").pop() ?? host);
      return [hasPort ? host : `${host}:${tls ? 443 : 80}`, tls];
    }
  }
  if (addr.includes("://")) {
    throw new ConfigError(`address ${JSON.stringify(raw)}: the scheme must be http:// or https://`);
  }
  if (!addr) {
    throw new ConfigError("the address is empty");
  }
  return [addr, false];
}

function adminKey(): string | undefined {
  const path = join(process.env.MENTIS_DATA_DIR ?? "mentis-data", "admin.key");
  try {
    return readFileSync(path, "utf8").trim() || undefined;
  } catch {
    return undefined;
  }
}

/**
 * Connect's session manager, with one change to the streams it opens: a stream whose request side is still open
 * is reset without being ended. Node's `Http2Stream.close(code)`, which Connect calls to cancel a call, ends
 * the request side first (END_STREAM: to the runtime a client stream that ended cleanly) and only then resets
 * it; a WriteFile or Upload cancelled midway (an abort, a local file that cannot be read) would be committed
 * with part of its data. `destroy(error)` resets it without the END_STREAM.
 */
class SessionManager extends Http2SessionManager {
  override async request(...args: Parameters<Http2SessionManager["request"]>): Promise<ClientHttp2Stream> {
    const stream = await super.request(...args);
    const close = stream.close.bind(stream);
    stream.close = (code?: number, callback?: () => void) => {
      if (code && !stream.writableEnded && !stream.destroyed) {
        if (callback) stream.once("close", callback);
        stream.destroy(new Error(`the call was cancelled (HTTP/2 code ${code})`));
        return;
      }
      close(code, callback);
    };
    return stream;
  }
}

/**
 * One HTTP/2 connection to the runtime (opened again by itself after it broke) and a client for each service.
 * `close()` ends it, and every call still on it.
 */
export class Connection {
  readonly sandboxes: Client<typeof SandboxService>;
  readonly actions: Client<typeof ActionService>;
  readonly files: Client<typeof FileService>;
  readonly spaces: Client<typeof SpaceService>;
  readonly snapshots: Client<typeof SnapshotService>;
  readonly templates: Client<typeof TemplateService>;
  readonly terminals: Client<typeof TerminalService>;
  readonly settings: Settings;
  private readonly session: Http2SessionManager;

  private constructor(settings: Settings) {
    this.settings = settings;
    const baseUrl = `${settings.tls ? "https" : "http"}://${settings.target}`;
    const interceptors: Interceptor[] = [];
    const key = settings.apiKey;
    if (key) {
      interceptors.push((next) => (req) => {
        req.header.set("authorization", `Bearer ${key}`);
        return next(req);
      });
    }
    const ping = { pingIntervalMs: 30_000, pingTimeoutMs: 15_000 };
    this.session = new SessionManager(baseUrl, ping, settings.ca ? { ca: settings.ca } : {});
    const transport = createGrpcTransport({
      baseUrl,
      interceptors,
      sessionManager: this.session,
      readMaxBytes: MAX_MESSAGE,
      writeMaxBytes: MAX_MESSAGE,
    });
    this.sandboxes = createClient(SandboxService, transport);
    this.actions = createClient(ActionService, transport);
    this.files = createClient(FileService, transport);
    this.spaces = createClient(SpaceService, transport);
    this.snapshots = createClient(SnapshotService, transport);
    this.templates = createClient(TemplateService, transport);
    this.terminals = createClient(TerminalService, transport);
  }

  static async open(options: ConnectionOptions = {}): Promise<Connection> {
    return new Connection(await resolveSettings(options));
  }

  /** `call()`'s result, or its failure as a typed error (`MentisError`'s subclasses; a connection that broke
   * under the call is `Unavailable`). */
  async call<T>(call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (e) {
      throw streamError(e);
    }
  }

  /** Ends the connection and every call on it. */
  close(): void {
    this.session.abort();
  }
}
