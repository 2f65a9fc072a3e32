"""Snapshots of workspaces (SnapshotService), the synchronous API.

    from mentis import Sandbox, Snapshots

    with Sandbox.create() as sb:
        sb.files.write("notes.txt", "kept")
        snap = sb.snapshot(labels={"conversation": "chat-1"})
    with Sandbox.create(snapshot_id=snap.id) as again:     # the workspace as it was
        print(again.files.read_text("notes.txt"))           # kept
    with Snapshots() as snapshots:
        print([s.id for s in snapshots.list(labels={"conversation": "chat-1"})])
        snapshots.delete(snap.id)

A snapshot is `/workspace` as a compressed archive in the runtime's snapshot store; it belongs to the space of
the sandbox it was taken from and restores only there (docs/ARCHITECTURE.md, "Snapshots").
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import grpc

from ._client import Connection, Settings
from .errors import from_rpc_error
from .terminal import _time
from .v1 import snapshot_pb2

__all__ = ["Snapshot", "Snapshots"]

# ListSnapshots' own cap on a page.
_MAX_PAGE = 1000


@dataclass
class Snapshot:
    """A snapshot of a sandbox's workspace. `sandbox_id` is the sandbox it was taken from (which may be gone
    since); `size_bytes` the compressed archive's size in the store, `archive_bytes` the tar archive's before
    compression; `sha256` the compressed archive's checksum (hex), checked when it is restored; `store` where
    it is kept (`"local"` or `"s3"`)."""

    id: str
    sandbox_id: str
    space_id: str
    labels: dict[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    size_bytes: int = 0
    archive_bytes: int = 0
    sha256: str = ""
    store: str = ""


def _snapshot(s: snapshot_pb2.Snapshot) -> Snapshot:
    return Snapshot(
        id=s.snapshot_id,
        sandbox_id=s.sandbox_id,
        space_id=s.space_id,
        labels=dict(s.labels),
        created_at=_time(s.create_time),
        size_bytes=s.size_bytes,
        archive_bytes=s.archive_bytes,
        sha256=s.sha256,
        store=s.store,
    )


def _create_request(sandbox_id: str, labels: dict[str, str] | None) -> snapshot_pb2.CreateSnapshotRequest:
    return snapshot_pb2.CreateSnapshotRequest(sandbox_id=sandbox_id, labels=labels or {})


def _list_request(
    sandbox_id: str, space: str, labels: dict[str, str] | None, page_size: int, limit: int
) -> snapshot_pb2.ListSnapshotsRequest:
    """The first page's request. A negative `limit` is refused here (ValueError), a negative `page_size` by
    the runtime (InvalidArgument, field `page_size`)."""
    if limit < 0:
        raise ValueError(f"limit must be 0 (no limit) or more, not {limit}")
    if not page_size and limit:
        page_size = min(limit, _MAX_PAGE)
    return snapshot_pb2.ListSnapshotsRequest(
        sandbox_id=sandbox_id, space_id=space, labels=labels or {}, page_size=page_size
    )


def _pages(
    fetch: Callable[[snapshot_pb2.ListSnapshotsRequest], snapshot_pb2.ListSnapshotsResponse],
    request: snapshot_pb2.ListSnapshotsRequest,
    limit: int,
) -> Iterator[Snapshot]:
    """Every snapshot of every page (at most `limit`, 0: all), following the page tokens."""
    seen = 0
    while True:
        r = fetch(request)
        for s in r.snapshots:
            yield _snapshot(s)
            seen += 1
            if limit and seen >= limit:
                return
        if not r.next_page_token:
            return
        request.page_token = r.next_page_token


class Snapshots:
    """The runtime's snapshots: `get`, `list`, `delete` (and `create`, which `Sandbox.snapshot` also does).
    Opens a connection of its own (the same `addr`, `api_key` and `tls` rules as `Sandbox.create`); used as a
    context manager it is closed at the end of the block."""

    def __init__(self, *, addr: str | None = None, api_key: str | None = None, tls: bool | None = None):
        self._conn = Connection(Settings.resolve(addr, api_key, tls=tls))

    @classmethod
    def _over(cls, conn: Connection) -> Snapshots:
        """Snapshots over an existing connection (a sandbox's)."""
        snapshots = cls.__new__(cls)
        snapshots._conn = conn
        return snapshots

    def _call(self, method_name: str, request: Any):
        try:
            return getattr(self._conn.snapshots, method_name)(request)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def create(self, sandbox_id: str, *, labels: dict[str, str] | None = None) -> Snapshot:
        """Takes a snapshot of the workspace of sandbox `sandbox_id` (RUNNING, or PAUSED with auto-resume)
        and returns it once complete."""
        return _snapshot(self._call("CreateSnapshot", _create_request(sandbox_id, labels)).snapshot)

    def get(self, snapshot_id: str) -> Snapshot:
        """One snapshot; NotFound (reason `SNAPSHOT_NOT_FOUND`) when there is none."""
        request = snapshot_pb2.GetSnapshotRequest(snapshot_id=snapshot_id)
        return _snapshot(self._call("GetSnapshot", request).snapshot)

    def list(
        self,
        *,
        sandbox_id: str = "",
        space: str = "",
        labels: dict[str, str] | None = None,
        page_size: int = 0,
        limit: int = 0,
    ) -> builtins.list[Snapshot]:
        """Snapshots, newest first, of every page: only those of `sandbox_id` and `space` when given, and
        only those carrying all of `labels`. `page_size` is how many each call fetches (0: the runtime's
        default, 100; at most 1000); `limit` stops after that many (0: all), so `limit=1` is the latest."""
        request = _list_request(sandbox_id, space, labels, page_size, limit)
        return builtins.list(_pages(lambda r: self._call("ListSnapshots", r), request, limit))

    def delete(self, snapshot_id: str) -> None:
        """Deletes a snapshot and its archive; a snapshot already gone is no error."""
        self._call("DeleteSnapshot", snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Snapshots:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
