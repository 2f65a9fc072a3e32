/**
 * Typed errors: every gRPC status a call ends with becomes one of these classes, with the rich details the
 * runtime attaches (docs/ERRORS.md): the stable `reason` (google.rpc.ErrorInfo), the offending `field`
 * (google.rpc.BadRequest) and, where a retry can help, `retryAfterMs` (google.rpc.RetryInfo).
 *
 * A command that fails is not an error: it is a result with its exit code.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** A call the runtime refused or could not complete. */
export class MentisError extends Error {
  /** The gRPC status code's name, as the runtime's docs write it: `"NOT_FOUND"`. */
  readonly code: string;
  /** The runtime's stable reason (`"SANDBOX_NOT_FOUND"`); empty when the status carried none. */
  readonly reason: string;
  /** The request field at fault (`"spec.cpu_limit"`); empty when none was named. */
  readonly field: string;
  /** How long a retry should wait, in milliseconds; undefined when a retry cannot help. */
  readonly retryAfterMs: number | undefined;
  /** ErrorInfo's key-values (ids). */
  readonly metadata: Record<string, string>;

  constructor(
    message: string,
    options: {
      code?: string;
      reason?: string;
      field?: string;
      retryAfterMs?: number;
      metadata?: Record<string, string>;
      cause?: unknown;
    } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code ?? (new.target as unknown as { CODE?: string }).CODE ?? "UNKNOWN";
    this.reason = options.reason ?? "";
    this.field = options.field ?? "";
    this.retryAfterMs = options.retryAfterMs;
    this.metadata = { ...(options.metadata ?? {}) };
  }

  override toString(): string {
    const where = this.field ? ` (${this.field})` : "";
    return `${this.name}: ${this.reason || this.code}: ${this.message}${where}`;
  }
}

/** The client is not configured well enough to reach a runtime (a bad address, no runtime to start). */
export class ConfigError extends MentisError {
  static readonly CODE = "CONFIG";
}
export class InvalidArgument extends MentisError {
  static readonly CODE = "INVALID_ARGUMENT";
}
export class NotFound extends MentisError {
  static readonly CODE = "NOT_FOUND";
}
export class AlreadyExists extends MentisError {
  static readonly CODE = "ALREADY_EXISTS";
}
export class PermissionDenied extends MentisError {
  static readonly CODE = "PERMISSION_DENIED";
}
export class Unauthenticated extends MentisError {
  static readonly CODE = "UNAUTHENTICATED";
}
export class ResourceExhausted extends MentisError {
  static readonly CODE = "RESOURCE_EXHAUSTED";
}
export class FailedPrecondition extends MentisError {
  static readonly CODE = "FAILED_PRECONDITION";
}
export class Aborted extends MentisError {
  static readonly CODE = "ABORTED";
}
export class OutOfRange extends MentisError {
  static readonly CODE = "OUT_OF_RANGE";
}
export class Unavailable extends MentisError {
  static readonly CODE = "UNAVAILABLE";
}
export class DeadlineExceeded extends MentisError {
  static readonly CODE = "DEADLINE_EXCEEDED";
}
export class Cancelled extends MentisError {
  static readonly CODE = "CANCELLED";
}
export class Internal extends MentisError {
  static readonly CODE = "INTERNAL";
}

type ErrorClass = new (message: string, options?: ConstructorParameters<typeof MentisError>[1]) => MentisError;

const BY_CODE: Partial<Record<Code, ErrorClass>> = {
  [Code.InvalidArgument]: InvalidArgument,
  [Code.NotFound]: NotFound,
  [Code.AlreadyExists]: AlreadyExists,
  [Code.PermissionDenied]: PermissionDenied,
  [Code.Unauthenticated]: Unauthenticated,
  [Code.ResourceExhausted]: ResourceExhausted,
  [Code.FailedPrecondition]: FailedPrecondition,
  [Code.Aborted]: Aborted,
  [Code.OutOfRange]: OutOfRange,
  [Code.Unavailable]: Unavailable,
  [Code.DeadlineExceeded]: DeadlineExceeded,
  [Code.Canceled]: Cancelled,
  [Code.Internal]: Internal,
};

const NAMES: Record<Code, string> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

/** A gRPC status code's name, as the runtime's docs write it: `"NOT_FOUND"`. */
export function codeName(code: Code): string {
  return NAMES[code] ?? "UNKNOWN";
}

function codeByName(name: string): Code | undefined {
  for (const [code, n] of Object.entries(NAMES)) {
    if (n === name) {
      return Number(code) as Code;
    }
  }
  return undefined;
}

/** The typed error for a failed call, with the status's rich details when it carries them. */
export function fromConnectError(e: unknown): MentisError {
  if (e instanceof MentisError) {
    return e;
  }
  const err = ConnectError.from(e);
  let reason = "";
  let field = "";
  let retryAfterMs: number | undefined;
  let metadata: Record<string, string> = {};
  for (const info of err.findDetails(ErrorInfoSchema)) {
    reason = info.reason;
    metadata = { ...info.metadata };
  }
  for (const bad of err.findDetails(BadRequestSchema)) {
    field = bad.fieldViolations[0]?.field ?? field;
  }
  for (const retry of err.findDetails(RetryInfoSchema)) {
    const d = retry.retryDelay;
    if (d) {
      retryAfterMs = Number(d.seconds) * 1000 + d.nanos / 1e6;
    }
  }
  const cls = BY_CODE[err.code] ?? MentisError;
  return new cls(err.rawMessage, { code: codeName(err.code), reason, field, retryAfterMs, metadata, cause: e });
}

/** The typed error for a refusal the runtime answered inside a stream (Connect's `rejected`: the gRPC code's
 * name, its message and reason), as `fromConnectError` makes it for a call's status. */
export function fromRejection(code: string, message: string, reason: string): MentisError {
  const known = codeByName(code);
  const cls = (known !== undefined ? BY_CODE[known] : undefined) ?? MentisError;
  return new cls(message, { code: code || "UNKNOWN", reason });
}
