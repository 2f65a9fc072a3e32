"""The connection to a runtime: where it is, the key every call carries, TLS, and the stubs.

Address: the `addr` argument, else `MENTIS_ADDR` (`host:port`, `http://host:port`, or `https://host:port`
for TLS), else a runtime the SDK starts for this process (embedded mode, see `_embedded`). Key: `api_key`,
else `MENTIS_API_KEY`, else the admin key file `$MENTIS_DATA_DIR/admin.key` when it is readable
(`MENTIS_DATA_DIR` defaults to `mentis-data`, as the runtime's does), else none. The same rules as the
`mentis` command line (docs/CLI.md).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from .errors import ConfigError
from .v1 import (
    action_pb2_grpc,
    file_pb2_grpc,
    sandbox_pb2_grpc,
    snapshot_pb2_grpc,
    space_pb2_grpc,
    template_pb2_grpc,
    terminal_pb2_grpc,
)

# Messages up to the runtime's own bound (MENTIS_MAX_MESSAGE_BYTES' default is 16 MiB).
_MAX_MESSAGE = 64 * 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """Where the runtime is and how to reach it."""

    target: str
    tls: bool
    api_key: str | None
    root_certificates: bytes | None = None

    @staticmethod
    def resolve(
        addr: str | None = None,
        api_key: str | None = None,
        *,
        tls: bool | None = None,
        root_certificates: bytes | None = None,
    ) -> Settings:
        raw = addr or os.environ.get("MENTIS_ADDR")
        if not raw:
            # Embedded mode: a runtime of this process's own (see `_embedded`).
            from . import _embedded

            target, key = _embedded.ensure_started()
            return Settings(target=target, tls=False, api_key=api_key or key)
        target, scheme_tls = _parse_addr(raw)
        key = api_key if api_key is not None else os.environ.get("MENTIS_API_KEY") or _admin_key()
        return Settings(
            target=target,
            tls=scheme_tls if tls is None else tls,
            api_key=key or None,
            root_certificates=root_certificates,
        )


def _parse_addr(raw: str) -> tuple[str, bool]:
    raw = raw.strip()
    for scheme, tls in (("https://", True), ("http://", False)):
        if raw.startswith(scheme):
            host = raw[len(scheme) :].rstrip("/")
            if "/" in host:
                raise ConfigError(f"address {raw!r} has a path; give scheme://host:port")
            return (host if ":" in host.rsplit("]", 1)[-1] else f"{host}:{443 if tls else 80}"), tls
    if "://" in raw:
        raise ConfigError(f"address {raw!r}: the scheme must be http:// or https://")
    return raw, False


def _admin_key() -> str | None:
    path = os.path.join(os.environ.get("MENTIS_DATA_DIR", "mentis-data"), "admin.key")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <key>` to every call."""

    def __init__(self, key: str) -> None:
        self._header = ("authorization", f"Bearer {key}")

    def _details(self, details):
        return details._replace(metadata=[*list(details.metadata or []), self._header])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class Connection:
    """A channel to the runtime and its stubs. `reconnect()` replaces the channel (after the old one was
    closed or broke); calls in flight on the old one fail and are resumed by their callers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._generation = 0
        self._open()

    def _open(self) -> None:
        s = self.settings
        options: Sequence[tuple[str, int]] = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.keepalive_time_ms", 30_000),
        ]
        if s.tls:
            creds = grpc.ssl_channel_credentials(root_certificates=s.root_certificates)
            channel = grpc.secure_channel(s.target, creds, options=options)
        else:
            channel = grpc.insecure_channel(s.target, options=options)
        self._raw = channel
        if s.api_key:
            channel = grpc.intercept_channel(channel, _Bearer(s.api_key))
        self._channel = channel
        self.sandboxes = sandbox_pb2_grpc.SandboxServiceStub(channel)
        self.actions = action_pb2_grpc.ActionServiceStub(channel)
        self.files = file_pb2_grpc.FileServiceStub(channel)
        self.spaces = space_pb2_grpc.SpaceServiceStub(channel)
        self.snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        self.templates = template_pb2_grpc.TemplateServiceStub(channel)
        self.terminals = terminal_pb2_grpc.TerminalServiceStub(channel)
        self._generation += 1

    @property
    def generation(self) -> int:
        """Counts the channels this connection has had: a caller that saw generation N fail reconnects only
        if nobody else did meanwhile."""
        return self._generation

    def reconnect(self, seen_generation: int) -> None:
        with self._lock:
            if self._generation != seen_generation:
                return
            with contextlib.suppress(Exception):
                self._raw.close()
            self._open()

    def close(self) -> None:
        """Closes the channel (a closed connection cannot be used again)."""
        with self._lock:
            self._raw.close()
