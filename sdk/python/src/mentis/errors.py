"""Typed errors: every gRPC status a call ends with becomes one of these, with the rich details the runtime
attaches (docs/ERRORS.md): the stable `reason` (google.rpc.ErrorInfo), the offending `field`
(google.rpc.BadRequest) and, where a retry can help, `retry_after` (google.rpc.RetryInfo).

A command that fails is not an error: it is a result with its exit code.
"""

from __future__ import annotations

import grpc

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "ConfigError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "MentisError",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "from_rejection",
    "from_rpc_error",
]


class MentisError(Exception):
    """A call the runtime refused or could not complete.

    `code` is the gRPC status code's name (`"NOT_FOUND"`), `reason` the runtime's stable reason
    (`"SANDBOX_NOT_FOUND"`; empty when the status carried none), `field` the request field at fault,
    `retry_after` seconds a retry should wait (None when a retry cannot help), `metadata` ErrorInfo's
    key-values (ids).
    """

    code: str = "UNKNOWN"

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        field: str = "",
        retry_after: float | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.field = field
        self.retry_after = retry_after
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        tag = self.reason or self.code
        where = f" ({self.field})" if self.field else ""
        return f"{tag}: {self.message}{where}"


class ConfigError(MentisError):
    """The client is not configured well enough to reach a runtime (no address, an unreadable key file)."""

    code = "CONFIG"


class InvalidArgument(MentisError):
    code = "INVALID_ARGUMENT"


class NotFound(MentisError):
    code = "NOT_FOUND"


class AlreadyExists(MentisError):
    code = "ALREADY_EXISTS"


class PermissionDenied(MentisError):
    code = "PERMISSION_DENIED"


class Unauthenticated(MentisError):
    code = "UNAUTHENTICATED"


class ResourceExhausted(MentisError):
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(MentisError):
    code = "FAILED_PRECONDITION"


class Aborted(MentisError):
    code = "ABORTED"


class OutOfRange(MentisError):
    code = "OUT_OF_RANGE"


class Unavailable(MentisError):
    code = "UNAVAILABLE"


class DeadlineExceeded(MentisError):
    code = "DEADLINE_EXCEEDED"


class Cancelled(MentisError):
    code = "CANCELLED"


class Internal(MentisError):
    code = "INTERNAL"


_BY_CODE: dict[grpc.StatusCode, type[MentisError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.INTERNAL: Internal,
}


def from_rejection(code: str, message: str, reason: str = "") -> MentisError:
    """The typed error for a refusal the runtime answered in a stream (Connect's `rejected`: the gRPC code's
    name, its message and reason), as `from_rpc_error` makes it for a call's status."""
    status = grpc.StatusCode.__members__.get(code)
    cls = _BY_CODE.get(status, MentisError) if status is not None else MentisError
    err = cls(message, reason=reason)
    if cls is MentisError:
        err.code = code or "UNKNOWN"
    return err


def from_rpc_error(e: grpc.RpcError) -> MentisError:
    """The typed error for a failed call, with the status's rich details when it carries them."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    message = (e.details() if hasattr(e, "details") else None) or str(e)
    cls = _BY_CODE.get(code, MentisError)
    reason, field, retry_after, metadata = "", "", None, {}
    try:
        from google.rpc import error_details_pb2
        from grpc_status import rpc_status

        status = rpc_status.from_call(e) if hasattr(e, "trailing_metadata") else None
    except Exception:
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                if bad.field_violations:
                    field = bad.field_violations[0].field
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_after = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    err = cls(message, reason=reason, field=field, retry_after=retry_after, metadata=metadata)
    if cls is MentisError:
        err.code = code.name if hasattr(code, "name") else "UNKNOWN"
    return err
