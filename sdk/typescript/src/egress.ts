/**
 * Egress rules (what a sandbox may reach) and the space secrets their headers name (docs/EGRESS.md).
 *
 *     await using secrets = new Secrets();
 *     await secrets.set("API_TOKEN", "tok-3141"); // sealed in the runtime's store; never returned
 *     await using sb = await Sandbox.create({
 *       egressRules: [{ domain: "api.example.com", ports: [443], headers: { Authorization: "Bearer {secret:API_TOKEN}" } }],
 *     });
 *     await sb.run("curl -sS https://api.example.com/user"); // the gateway sets the header, unseen here
 *     console.log(await sb.egressDenials());                // what the gateway refused it
 *
 * A sandbox's egress is `"deny"` (no route out), `"allow"` (any route out) or `"rules"` (only what its rules
 * allow, through the runtime's egress gateway, which also answers its DNS). Its rules change while it runs
 * (`sb.updateEgressRules`), and so does its mode while it is RUNNING (`sb.updateEgress`).
 */
import { create } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import {
  Egress,
  type EgressDenial as EgressDenialMessage,
  type EgressRule as EgressRuleMessage,
  EgressRuleSchema,
  type UpdateSandboxRequest,
  UpdateSandboxRequestSchema,
} from "./gen/mentis/v1/sandbox_pb.js";
import type { Connection } from "./client.js";
import { InvalidArgument } from "./errors.js";
import { str } from "./args.js";
import { ServiceConnection, type ServiceOptions } from "./service.js";

/** What a sandbox may reach on the network (docs/EGRESS.md). */
export type EgressMode = "deny" | "allow" | "rules";

/** One egress rule: a domain (or `*.domain`) or a CIDR, on some ports, with headers the proxy adds. */
export interface EgressRule {
  domain?: string;
  cidr?: string;
  ports?: number[];
  /** Headers the egress gateway sets on HTTP requests that match (a value may name a secret: `{secret:NAME}`). */
  headers?: Record<string, string>;
}

/** An egress mode's name, lower case. */
export function egressName(egress: Egress): EgressMode | "unspecified" {
  return (Egress[egress] ?? "UNSPECIFIED").toLowerCase() as EgressMode | "unspecified";
}

/** A mode's value for the API; InvalidArgument naming `field` for a name that is none. */
export function egressValue(mode: string, field: string): Egress {
  // Any case, as the Python SDK takes it ("DENY" too).
  const value = typeof mode === "string" ? { deny: Egress.DENY, allow: Egress.ALLOW, rules: Egress.RULES }[mode.toLowerCase()] : undefined;
  if (value === undefined) {
    throw new InvalidArgument(`${field} must be "deny", "allow" or "rules", not ${JSON.stringify(mode)}`, { field });
  }
  return value;
}

/** A rule as the API takes it. */
export function ruleMessage(rule: EgressRule): EgressRuleMessage {
  return create(EgressRuleSchema, {
    domain: rule.domain ?? "",
    cidr: rule.cidr ?? "",
    ports: rule.ports ?? [],
    headers: Object.entries(rule.headers ?? {}).map(([name, value]) => ({ name, value })),
  });
}

/** A rule as the API gave it. */
export function ruleOf(m: EgressRuleMessage): EgressRule {
  const rule: EgressRule = {};
  if (m.domain) rule.domain = m.domain;
  if (m.cidr) rule.cidr = m.cidr;
  if (m.ports.length) rule.ports = [...m.ports];
  if (m.headers.length) rule.headers = Object.fromEntries(m.headers.map((h) => [h.name, h.value]));
  return rule;
}

/** A connection or DNS question the egress gateway refused a sandbox. */
export interface EgressDenial {
  time: Date | undefined;
  /** `"tcp"`, `"dns"` or `"http"`. */
  protocol: string;
  /** The name asked for or sent (DNS, TLS server name, HTTP Host), when there was one. */
  name: string;
  /** The address and port it was for (`"203.0.113.7:22"`), when there was one. */
  address: string;
  /** Why, in words (`"no rule allows api.example.com"`). */
  reason: string;
}

/** @internal The rules as messages; InvalidArgument (field `rules`, `rules[i]...`) for what is no rule. */
export function ruleMessages(rules: EgressRule[] | undefined, field = "rules"): EgressRuleMessage[] {
  if (rules === undefined) return [];
  if (!Array.isArray(rules)) throw new InvalidArgument(`${field} must be an array of rules`, { field });
  return rules.map((rule, i) => {
    const at = `${field}[${i}]`;
    if (typeof rule !== "object" || rule === null) throw new InvalidArgument(`${at} is no rule`, { field: at });
    for (const key of ["domain", "cidr"] as const) {
      if (rule[key] !== undefined && typeof rule[key] !== "string") {
        throw new InvalidArgument(`${at}.${key} must be a string`, { field: `${at}.${key}` });
      }
    }
    const ports: unknown = rule.ports ?? [];
    if (!Array.isArray(ports) || !ports.every((p) => Number.isInteger(p) && p >= 0 && p <= 0xffff_ffff)) {
      throw new InvalidArgument(`${at}.ports must be an array of port numbers`, { field: `${at}.ports` });
    }
    const headers: unknown = rule.headers ?? {};
    if (typeof headers !== "object" || headers === null || !Object.values(headers).every((v) => typeof v === "string")) {
      throw new InvalidArgument(`${at}.headers must be an object of strings`, { field: `${at}.headers` });
    }
    return ruleMessage(rule);
  });
}

/** @internal UpdateSandbox's request that gives a sandbox these rules (the mask's `egress_rules` only). */
export function rulesRequest(sandboxId: string, rules: EgressRule[]): UpdateSandboxRequest {
  if (rules === undefined) throw new InvalidArgument("rules must be an array of rules", { field: "rules" });
  return create(UpdateSandboxRequestSchema, {
    sandbox: { sandboxId, egressRules: ruleMessages(rules) },
    updateMask: { paths: ["egress_rules"] },
  });
}

/** @internal UpdateSandbox's request that gives a sandbox another mode and these rules (both in the mask). */
export function modeRequest(sandboxId: string, mode: EgressMode, rules: EgressRule[] | undefined): UpdateSandboxRequest {
  return create(UpdateSandboxRequestSchema, {
    sandbox: { sandboxId, egress: egressValue(mode, "egress"), egressRules: ruleMessages(rules) },
    updateMask: { paths: ["egress", "egress_rules"] },
  });
}

/** @internal */
export function denialOf(d: EgressDenialMessage): EgressDenial {
  return {
    time: d.time ? timestampDate(d.time) : undefined,
    protocol: d.protocol,
    name: d.name,
    address: d.address,
    reason: d.reason,
  };
}

/** Options of `new Secrets()`: the space, and where the runtime is. */
export interface SecretsOptions extends ServiceOptions {
  /** The space whose secrets these are (default: `"default"`). */
  space?: string;
}

/**
 * The secrets of a space: values the egress gateway puts into the headers of its sandboxes' requests where a
 * rule names them (`"{secret:NAME}"`), and that never enter a sandbox. `set`, `list` (names only: no call
 * returns a value) and `delete`. It opens a connection of its own at its first call (the same options and
 * defaults as `Sandbox.create`), or uses `connection`; `close()` (or `await using`) closes its own. A key scoped
 * to spaces manages its spaces' secrets only (PermissionDenied otherwise).
 */
export class Secrets {
  private readonly conn: ServiceConnection;
  /** The space ("" is `"default"`). */
  readonly space: string;

  constructor(options: SecretsOptions | Connection = {}) {
    this.conn = new ServiceConnection(options, "Secrets");
    this.space = "space" in options ? str(options.space, "space") : "";
  }

  /** Sets secret `name` (letters, digits and '_', not starting with a digit, at most 64) to `value` (at most 4096
   * bytes, no control characters), made or replaced; sandboxes' next requests get the new value.
   * InvalidArgument (field `name` or `value`) for what the runtime refuses, NotFound when the space is unknown. */
  async set(name: string, value: string): Promise<void> {
    const request = { spaceId: this.space, name: str(name, "name"), value: str(value, "value") };
    await this.conn.call((c) => c.spaces.setSecret(request));
  }

  /** The names of the space's secrets, in name order (never their values). */
  async list(): Promise<string[]> {
    const r = await this.conn.call((c) => c.spaces.listSecrets({ spaceId: this.space }));
    return [...r.names];
  }

  /** Removes secret `name`; requests of rules that name it are then refused by the gateway. NotFound when the
   * space has no such secret. */
  async delete(name: string): Promise<void> {
    const request = { spaceId: this.space, name: str(name, "name") };
    await this.conn.call((c) => c.spaces.deleteSecret(request));
  }

  /** Closes the connection (when it is this object's own). */
  async close(): Promise<void> {
    await this.conn.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
