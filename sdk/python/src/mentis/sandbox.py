"""Sandboxes, commands and cells (the synchronous API).

    from mentis import Sandbox

    with Sandbox.create() as sb:                 # deleted when the block ends
        r = sb.run("echo hi; exit 3")
        print(r.exit_code, r.stdout)             # 3 hi
        cell = sb.run_code("x = 6 * 7\\nx")
        print(cell.results[0]["text/plain"])     # 42
        job = sb.run("sleep 1; echo later", background=True)   # a CommandHandle, at once
        print(job.wait().stdout)                 # later

Every action carries an action id the SDK makes: a stream that drops is resumed from the last observation
received (StreamObservations with after_seq), and a submit that failed in transit is sent again with the
same id, which the runtime runs once (docs/ARCHITECTURE.md, "Guarantees"). Callers see each byte once.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import math
import os
import queue
import stat
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, overload

import grpc

from . import _transfer
from ._client import Connection, Settings
from .egress import (
    EgressDenial,
    EgressRule,
    _denial,
    _egress_mode,
    _mode_request,
    _rule,
    _rule_messages,
    _update_rules_request,
)
from .errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    MentisError,
    NotFound,
    from_rejection,
    from_rpc_error,
)
from .processes import Processes
from .snapshot import Snapshot, Snapshots
from .terminal import Terminals, _time, _until_none
from .v1 import action_pb2, file_pb2, observation_pb2, sandbox_pb2
from .watch import FileEvent, FileWatch, _attach_watch_request, _watch_request

__all__ = [
    "CellError",
    "CellResult",
    "CommandHandle",
    "CommandResult",
    "FileInfo",
    "Files",
    "PreviewUrl",
    "Sandbox",
    "SandboxInfo",
]

# Statuses after which a stream is resumed rather than failed: the connection broke, not the call.
_RESUMABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
# How long a broken stream keeps being resumed before the error is raised.
_RESUME_FOR = 60.0
_CHUNK = 1 << 20


@dataclass
class CommandResult:
    """How a shell command ended. `exit_code` is the command's (128 + N when signal N killed it); `reason`
    is `"exited"`, `"timed_out"`, `"cancelled"`, `"lost"`, `"failed_to_start"`, `"oom_killed"` or
    `"pids_limit_reached"`; `message` says more when it is not `"exited"`."""

    exit_code: int
    reason: str
    stdout_bytes: bytes
    stderr_bytes: bytes
    signal: int = 0
    message: str = ""
    duration: float = 0.0
    action_id: str = ""

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.reason == "exited" and self.exit_code == 0


@dataclass
class CellError:
    name: str
    value: str
    traceback: list[str]


@dataclass
class CellResult:
    """How a cell ended. `status` is `"ok"`, `"error"` or `"aborted"`; `text` is what it printed (stdout and
    stderr in order); `results` the rich outputs (display data and the cell's value) as MIME bundles, images
    (`image/png`, `image/jpeg`) as bytes; `error` the exception when `status` is `"error"`; `reason` why an
    aborted cell did not run to its end."""

    status: str
    text: str
    results: list[dict[str, Any]]
    error: CellError | None = None
    execution_count: int = 0
    reason: str = ""
    duration: float = 0.0
    action_id: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class FileInfo:
    path: str
    size: int
    mode: int
    is_dir: bool
    symlink_target: str = ""


@dataclass
class PreviewUrl:
    """A URL that reaches one port of the sandbox through the runtime's HTTP listener (docs/PREVIEW.md),
    until `expires_at` or until it is revoked. `url` carries the token as `?mentis_preview_token=`; `token`
    is the token alone (programs may send it as the `X-Mentis-Preview-Token` header instead); `path` is the
    path-based URL without the runtime's address, for a client that reaches the runtime by another one."""

    url: str
    token: str
    path: str
    expires_at: datetime | None


@dataclass
class SandboxInfo:
    """A sandbox as `Sandbox.list` reports it; `Sandbox.connect(info.id)` works with it. `state` is as
    `Sandbox.state` names it (`"running"`, `"paused"`, `"terminated"`, ...), `state_reason` why, when that
    is worth saying; `key` its external key (`get_or_create`), empty when none; `template` the template it
    was made from, empty when none."""

    id: str
    state: str
    space_id: str
    key: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    image: str = ""
    template: str = ""
    created_at: datetime | None = None
    last_activity_at: datetime | None = None
    state_reason: str = ""


# A sandbox's states as `Sandbox.state` names them.
_STATES = {
    name.removeprefix("SANDBOX_STATE_").lower(): value
    for name, value in sandbox_pb2.SandboxState.items()
    if value != sandbox_pb2.SANDBOX_STATE_UNSPECIFIED
}
# ListSandboxes' own cap on a page.
_MAX_PAGE = 1000


def _sandbox_info(s: sandbox_pb2.Sandbox) -> SandboxInfo:
    return SandboxInfo(
        id=s.sandbox_id,
        state=_enum_name(sandbox_pb2.SandboxState, s.state, "SANDBOX_STATE_"),
        space_id=s.space_id,
        key=s.external_key,
        labels=dict(s.labels),
        image=s.image,
        template=s.template,
        created_at=_time(s.create_time),
        last_activity_at=_time(s.last_activity_time),
        state_reason=s.state_reason,
    )


def _list_sandboxes_request(
    space: str,
    labels: dict[str, str] | None,
    state: str | Iterable[str] | None,
    page_size: int,
    limit: int,
) -> sandbox_pb2.ListSandboxesRequest:
    """ListSandboxes' first request. A state that is none, or a negative `limit`, is ValueError here, before
    any call; a negative `page_size` is the runtime's InvalidArgument (field `page_size`)."""
    if limit < 0:
        raise ValueError(f"limit must be 0 (no limit) or more, not {limit}")
    names = [state] if isinstance(state, str) else builtins.list(state or ())
    states = []
    for name in names:
        value = _STATES.get(name.strip().lower()) if isinstance(name, str) else None
        if value is None:
            allowed = ", ".join(repr(n) for n in _STATES)
            raise ValueError(f"a sandbox state is one of {allowed}, not {name!r}")
        states.append(value)
    if not page_size and limit:
        page_size = min(limit, _MAX_PAGE)
    return sandbox_pb2.ListSandboxesRequest(
        space_id=space, labels=labels or {}, states=states, page_size=page_size
    )


# The largest value a uint32 request field carries; the runtime judges the rest (1-65535, not the executor's).
_MAX_U32 = 0xFFFFFFFF


def _preview_port(port: Any, *, every: bool = False) -> int:
    """`port` for a preview request; None is every port (0) where `every` allows it."""
    if port is None and every:
        return 0
    if not isinstance(port, int) or isinstance(port, bool):
        raise InvalidArgument(f"port must be an int, not {type(port).__name__}", field="port")
    if port < 0 or port > _MAX_U32 or (every and port == 0):
        more = "; port=None revokes the URLs of every port" if every else ""
        raise InvalidArgument(f"port {port} is not a port (1-65535){more}", field="port")
    return port


def _preview_request(sandbox_id: str, port: Any, ttl: float | None) -> sandbox_pb2.GetPreviewUrlRequest:
    """GetPreviewUrl's request; a ttl that is not a positive number of seconds is refused here."""
    port = _preview_port(port)
    if ttl is None:
        seconds = 0  # the runtime's default, an hour
    elif isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise InvalidArgument(
            f"ttl must be a positive number of seconds (None: an hour), not {ttl!r}", field="ttl_seconds"
        )
    else:
        seconds = _MAX_U32 if ttl > _MAX_U32 else math.ceil(ttl)  # over 7 days: the runtime refuses it
    return sandbox_pb2.GetPreviewUrlRequest(sandbox_id=sandbox_id, port=port, ttl_seconds=seconds)


def _preview_url(r: sandbox_pb2.GetPreviewUrlResponse) -> PreviewUrl:
    return PreviewUrl(url=r.url, token=r.token, path=r.path, expires_at=_time(r.expire_time))


def _revoke_request(sandbox_id: str, port: Any) -> sandbox_pb2.RevokePreviewUrlsRequest:
    return sandbox_pb2.RevokePreviewUrlsRequest(sandbox_id=sandbox_id, port=_preview_port(port, every=True))


def _enum_name(enum, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix).lower()


def _whole_seconds(timeout: float | None) -> int:
    """A timeout in whole seconds, rounded up (0: the runtime's default)."""
    return math.ceil(timeout) if timeout else 0


def _seconds(d) -> float:
    return d.seconds + d.nanos / 1e9


class _ActionStream:
    """One action's observations, each once, across dropped streams: Execute first, StreamObservations with
    the action id and the last seq after a drop; the submit itself is retried with the same action id.

    Without an action it follows one submitted before (`Sandbox.attach_command`): StreamObservations with the
    action id from the start of the sandbox's log. `on_open` is called once, at the first message the
    runtime sends (an observation or a keepalive), which tells an accepted stream from a refused one. `stop`
    ends the iteration from another thread, without the action's end."""

    def __init__(
        self,
        conn: Connection,
        sandbox_id: str,
        action: action_pb2.Action | None,
        action_id: str = "",
        on_open: Callable[[], None] | None = None,
    ) -> None:
        self.conn = conn
        self.sandbox_id = sandbox_id
        self.action = action
        self.action_id = action_id or str(uuid.uuid4())
        self.last_seq = 0
        self.on_open = on_open
        self.stopped = False
        self._lock = threading.Lock()
        self._call: Any = None

    def stop(self) -> None:
        """Ends the iteration (from another thread): the stream is cancelled and not resumed."""
        with self._lock:
            self.stopped = True
            call = self._call
        if call is not None:
            call.cancel()

    def _open(self, started: bool) -> Any:
        if not started:
            assert self.action is not None
            call = self.conn.actions.Execute(
                action_pb2.ExecuteRequest(
                    sandbox_id=self.sandbox_id, action=self.action, action_id=self.action_id
                )
            )
        else:
            call = self.conn.actions.StreamObservations(
                action_pb2.StreamObservationsRequest(
                    sandbox_id=self.sandbox_id, after_seq=self.last_seq, action_id=self.action_id
                )
            )
        with self._lock:
            self._call = call
            stopped = self.stopped
        if stopped:
            call.cancel()
        return call

    def __iter__(self) -> Iterator[observation_pb2.Observation]:
        deadline: float | None = None
        started = self.action is None
        try:
            while not self.stopped:
                generation = self.conn.generation
                try:
                    for response in self._open(started):
                        if self.on_open is not None:
                            self.on_open()
                            self.on_open = None
                        if not response.HasField("observation"):
                            continue
                        obs = response.observation
                        started = True
                        if obs.seq <= self.last_seq:
                            continue
                        self.last_seq = obs.seq
                        deadline = None
                        yield obs
                        if obs.HasField("cmd_end") or obs.HasField("ipython_result"):
                            return
                    # The stream ended without the action's end (a proxy cut it): resume, within the deadline.
                    failure: MentisError | None = MentisError("the stream ended before the action did")
                except grpc.RpcError as e:
                    if self.stopped:
                        return
                    if e.code() not in _RESUMABLE:
                        raise from_rpc_error(e) from None
                    failure = from_rpc_error(e)
                    # A broken channel is replaced; a refused submit is sent again with the same action id.
                    self.conn.reconnect(generation)
                now = time.monotonic()
                deadline = deadline or now + _RESUME_FOR
                if now > deadline:
                    raise failure
                time.sleep(0.05)
        finally:
            # Left early (a callback's error, `stop`): the call goes with it.
            with self._lock:
                call, self._call = self._call, None
            if call is not None:
                call.cancel()


def _submit(conn: Connection, sandbox_id: str, action: action_pb2.Action, action_id: str) -> None:
    """Has the runtime accept `action` as `action_id` and returns then, before it runs (Connect: attach,
    submit, its answer): a refusal is raised here, and a command queued behind the others of its session does
    not hold the caller up. A submit cut in transit is sent again with the same id (the runtime runs it
    once), as is one refused as UNAVAILABLE, within `_RESUME_FOR`."""
    attach = action_pb2.ConnectRequest(attach=action_pb2.ConnectRequest.Attach(sandbox_id=sandbox_id))
    submit = action_pb2.ConnectRequest(
        submit=action_pb2.ConnectRequest.Submit(action=action, action_id=action_id)
    )
    deadline: float | None = None
    while True:
        generation = conn.generation
        requests: queue.Queue = queue.Queue()
        requests.put(attach)
        requests.put(submit)
        call = conn.actions.Connect(_until_none(requests))
        failure: MentisError
        try:
            for response in call:
                kind = response.WhichOneof("kind")
                if kind == "accepted" and response.accepted.action_id == action_id:
                    return
                if kind == "rejected":
                    r = response.rejected
                    failure = from_rejection(r.code, r.message, r.reason)
                    if failure.code != "UNAVAILABLE":
                        raise failure
                    break
            else:
                failure = MentisError("the stream ended before the submit was answered")
        except grpc.RpcError as e:
            if e.code() not in _RESUMABLE:
                raise from_rpc_error(e) from None
            failure = from_rpc_error(e)
            conn.reconnect(generation)
        finally:
            requests.put(None)
            call.cancel()
        now = time.monotonic()
        deadline = deadline or now + _RESUME_FOR
        if now > deadline:
            raise failure
        time.sleep(0.05)


def _command_id(action_id: Any) -> str:
    """A command's action id for `attach_command`; an empty one (which would follow every action) is
    refused here."""
    if not isinstance(action_id, str) or not action_id:
        raise InvalidArgument(f"action_id must name a command, not {action_id!r}", field="action_id")
    return action_id


def _detached(action_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"command {action_id} was detached before its end (it runs on: attach_command({action_id!r}))"
    )


class CommandHandle:
    """A shell command running in the background, made by `sb.run(..., background=True)` or
    `sb.attach_command(action_id)`: `wait` for its result, `kill` it, or `detach` from it (it runs on).

    A thread of the handle follows the command's output and passes it to `on_stdout` / `on_stderr` as it
    arrives, in order (from that thread; decoded as UTF-8, a character split across chunks kept whole); it
    ends with the command, at `detach`, or when the sandbox's connection is closed. Streams that drop are
    resumed, as for `run`. `action_id` names the command: `attach_command` follows it again, from this or
    another process, with its output from the start."""

    def __init__(
        self,
        stream: _ActionStream,
        on_stdout: Callable[[str], None] | None,
        on_stderr: Callable[[str], None] | None,
        *,
        wait_open: bool,
    ) -> None:
        self._stream = stream
        self._conn = stream.conn
        self._sandbox_id = stream.sandbox_id
        self.action_id: str = stream.action_id
        self._collect = _CommandCollector(on_stdout, on_stderr)
        self._cond = threading.Condition()
        self._opened = False
        self._done = False
        self._result: CommandResult | None = None
        self._failure: BaseException | None = None
        stream.on_open = self._open
        self._thread = threading.Thread(
            target=self._follow, name=f"mentis-command-{self.action_id}", daemon=True
        )
        self._thread.start()
        if wait_open:
            try:
                with self._cond:
                    self._cond.wait_for(lambda: self._opened or self._done)
            except BaseException:  # interrupted (KeyboardInterrupt): no thread is left following
                self.detach()
                raise
            if self._failure is not None:
                self._thread.join()
                raise self._failure

    def _open(self) -> None:
        with self._cond:
            self._opened = True
            self._cond.notify_all()

    def _follow(self) -> None:
        """The thread: the command's observations into its result and the callbacks, until its end, a
        detach or a failure (a refused call, a callback's error)."""
        result: CommandResult | None = None
        failure: BaseException | None = None
        observations = iter(self._stream)
        try:
            for obs in observations:
                self._collect.feed(obs)
            if self._collect.ended or not self._stream.stopped:
                result = self._collect.result(self.action_id)
            else:
                failure = _detached(self.action_id)
        except BaseException as e:  # the runtime's refusal or a callback's error: wait() raises it
            failure = e
        finally:
            observations.close()  # type: ignore[attr-defined]
        with self._cond:
            self._result, self._failure, self._done = result, failure, True
            self._cond.notify_all()

    def __repr__(self) -> str:
        return f"CommandHandle({self.action_id!r}, done={self._done!r})"

    def wait(self, timeout: float | None = None) -> CommandResult:
        """Waits for the command's end and returns its result (as `run` does). TimeoutError when it runs on
        after `timeout` seconds; FailedPrecondition when it was detached first; a callback's error, or a
        refused call, is raised here."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError(f"command {self.action_id} still runs after {timeout} s")
        self._thread.join()
        if self._failure is not None:
            raise self._failure
        assert self._result is not None
        return self._result

    def kill(self) -> None:
        """Cancels the command: its process group is killed, and `wait` then returns its result with reason
        `"cancelled"` (in a session, the command is interrupted and the session kept). A command that has
        ended is left as it was (no error)."""
        request = action_pb2.CancelActionRequest(sandbox_id=self._sandbox_id, action_id=self.action_id)
        _call(self._conn.actions.CancelAction, request)

    def detach(self) -> None:
        """Stops following the command, which runs on in the sandbox: its thread ends, and
        `sb.attach_command(handle.action_id)` follows it again. Detaching twice, or after the end, is no
        error."""
        self._stream.stop()
        if threading.current_thread() is not self._thread:
            self._thread.join()


class Sandbox:
    """A sandbox on a runtime. Make one with `create`, `connect` or `get_or_create`; used as a context
    manager, a sandbox this object created is deleted at the end of the block (`keep=True` keeps it)."""

    def __init__(self, conn: Connection, info: sandbox_pb2.Sandbox, *, owned: bool, keep: bool = False):
        self._conn = conn
        self._info = info
        self._owned = owned
        self._keep = keep
        self.files = Files(self)
        self.terminals = Terminals(self)
        self.processes = Processes(self)
        # Terminals and background commands with a stream on this sandbox's connection, detached when it
        # closes, and watches, closed then.
        self._open_terminals: weakref.WeakSet = weakref.WeakSet()
        self._open_commands: weakref.WeakSet = weakref.WeakSet()
        self._open_watches: weakref.WeakSet = weakref.WeakSet()

    # --- making one

    @classmethod
    def create(
        cls,
        *,
        image: str = "",
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        space: str = "",
        key: str = "",
        cpu: float = 0.0,
        memory_mb: int = 0,
        idle_timeout: int = 0,
        snapshot_id: str = "",
        template: str = "",
        egress: str | None = None,
        egress_rules: builtins.list[EgressRule] | None = None,
        keep: bool = False,
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
    ) -> Sandbox:
        """Creates a sandbox (0 / empty means the runtime's default for each setting). `key` is an external
        key (`get_or_create` finds the sandbox by it). `snapshot_id`: the workspace is restored from that
        snapshot (of the same space) before this returns; NotFound when there is none, FailedPrecondition
        (reason `SNAPSHOT_CORRUPT`) when its archive is damaged, and then no sandbox is left. `template`: a
        template of the space (`Templates`) fills what the other arguments leave unset (its image, each limit
        left at 0, its env under `env`), shell commands start in its `work_dir`, and its start-up commands
        have run when this returns; NotFound when the space has none of that name, FailedPrecondition when a
        start-up command fails (with its output; no sandbox is left). `egress` is what code in it may reach:
        `"deny"` (no route out), `"allow"` (any route out) or `"rules"` (only what `egress_rules` allow,
        through the runtime's egress gateway; docs/EGRESS.md); None: the template's, else the space's, else
        the runtime's default, or `"rules"` when `egress_rules` are given. Another value is ValueError, before
        any call; a rule the runtime refuses is InvalidArgument naming it (`field`
        `spec.egress_rules[0].domain`)."""
        spec = _spec(
            space,
            key,
            image=image,
            env=env,
            labels=labels,
            cpu=cpu,
            memory_mb=memory_mb,
            idle_timeout=idle_timeout,
            snapshot_id=snapshot_id,
            template=template,
            egress=egress,
            egress_rules=egress_rules,
        )
        conn = Connection(Settings.resolve(addr, api_key, tls=tls))
        with _closed_on_error(conn):
            info = _call(conn.sandboxes.CreateSandbox, sandbox_pb2.CreateSandboxRequest(spec=spec)).sandbox
        return cls(conn, info, owned=True, keep=keep)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
    ) -> Sandbox:
        """An existing sandbox, by id (NotFound when there is none). Not deleted at the end of a block."""
        conn = Connection(Settings.resolve(addr, api_key, tls=tls))
        with _closed_on_error(conn):
            request = sandbox_pb2.GetSandboxRequest(sandbox_id=sandbox_id)
            info = _call(conn.sandboxes.GetSandbox, request).sandbox
        return cls(conn, info, owned=False)

    @classmethod
    def get_or_create(
        cls,
        *,
        key: str,
        space: str = "",
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
        **create_args: Any,
    ) -> Sandbox:
        """The sandbox with external key `key` in `space`, created (with `create_args`, the keywords of
        `create` that make its spec) when there is none. Never deleted at the end of a block: it is meant to
        be found again."""
        spec = _spec(space, key, **create_args)  # a mistake in them is raised before any call
        conn = Connection(Settings.resolve(addr, api_key, tls=tls))
        with _closed_on_error(conn):
            return cls._get_or_create(conn, key, space, spec)

    @classmethod
    def list(
        cls,
        *,
        space: str = "",
        labels: dict[str, str] | None = None,
        state: str | Iterable[str] | None = None,
        page_size: int = 0,
        limit: int = 0,
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
    ) -> builtins.list[SandboxInfo]:
        """The sandboxes the key may see, oldest first, every page followed: only those of `space` when
        given, only those carrying all of `labels`, only those in `state` (a state's name, such as
        `"running"`, or several) when given. Deleted sandboxes stay listed as `"terminated"` for a while:
        `state="running"` leaves them out. `page_size` is how many each call fetches (0: the runtime's
        default, 100; at most 1000); `limit` stops after that many (0: all). An unknown state is ValueError,
        before any call."""
        request = _list_sandboxes_request(space, labels, state, page_size, limit)
        conn = Connection(Settings.resolve(addr, api_key, tls=tls))
        found: builtins.list[SandboxInfo] = []
        try:
            while True:
                r = _call(conn.sandboxes.ListSandboxes, request)
                found.extend(_sandbox_info(s) for s in r.sandboxes)
                if limit and len(found) >= limit:
                    return found[:limit]
                if not r.next_page_token:
                    return found
                request.page_token = r.next_page_token
        finally:
            conn.close()

    @classmethod
    def _get_or_create(cls, conn: Connection, key: str, space: str, spec: sandbox_pb2.SandboxSpec) -> Sandbox:
        request = sandbox_pb2.GetSandboxByKeyRequest(space_id=space, external_key=key)
        for _ in range(3):
            try:
                info = _call(conn.sandboxes.GetSandboxByKey, request).sandbox
                return cls(conn, info, owned=False)
            except NotFound:
                pass
            try:
                info = _call(
                    conn.sandboxes.CreateSandbox, sandbox_pb2.CreateSandboxRequest(spec=spec)
                ).sandbox
                return cls(conn, info, owned=False)
            except AlreadyExists:
                continue  # created by someone else meanwhile: find it
        raise MentisError(f"no sandbox with key {key!r} could be found or created")

    # --- what it is

    @property
    def id(self) -> str:
        return self._info.sandbox_id

    @property
    def state(self) -> str:
        """The state when last fetched (`refresh()` fetches it again): `"running"`, `"paused"`, ..."""
        return _enum_name(sandbox_pb2.SandboxState, self._info.state, "SANDBOX_STATE_")

    @property
    def template(self) -> str:
        """The template it was made from; empty when none."""
        return self._info.template

    @property
    def work_dir(self) -> str:
        """Where shell commands that name no directory start (its template's `work_dir`, relative to
        `/workspace` or absolute); empty: `/workspace`."""
        return self._info.work_dir

    @property
    def runtime_class(self) -> str:
        """The runtime class it runs under (its template's, else its space's, such as `runsc` for gVisor);
        empty: the runtime's default."""
        return self._info.runtime_class

    @property
    def egress(self) -> str:
        """What code in it may reach (the default resolved when it was made): `"deny"`, `"allow"` or
        `"rules"` (only what `egress_rules` allow)."""
        return _enum_name(sandbox_pb2.Egress, self._info.egress, "EGRESS_")

    @property
    def egress_rules(self) -> builtins.list[EgressRule]:
        """Its egress rules when last fetched (with egress `"rules"`; empty otherwise), each with its ports
        filled in (443 and 80 when the rule named none); header values as written (`"{secret:NAME}"`),
        never a secret's value."""
        return [_rule(r) for r in self._info.egress_rules]

    def refresh(self) -> Sandbox:
        self._info = _call(
            self._conn.sandboxes.GetSandbox, sandbox_pb2.GetSandboxRequest(sandbox_id=self.id)
        ).sandbox
        return self

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.state!r})"

    # --- lifecycle

    def pause(self) -> Sandbox:
        self._info = _call(
            self._conn.sandboxes.PauseSandbox, sandbox_pb2.PauseSandboxRequest(sandbox_id=self.id)
        ).sandbox
        return self

    def resume(self) -> Sandbox:
        self._info = _call(
            self._conn.sandboxes.ResumeSandbox, sandbox_pb2.ResumeSandboxRequest(sandbox_id=self.id)
        ).sandbox
        return self

    def snapshot(self, *, labels: dict[str, str] | None = None) -> Snapshot:
        """Takes a snapshot of the workspace (`/workspace`) and returns it once it is complete in the
        runtime's store; `Sandbox.create(snapshot_id=...)` brings it back in a new sandbox, even after this
        one is deleted. `labels` are for finding it again (`Snapshots.list(labels=...)`)."""
        return Snapshots._over(self._conn).create(self.id, labels=labels)

    def preview_url(self, port: int, ttl: float | None = None) -> PreviewUrl:
        """A URL that opens `port` of this sandbox from outside, through the runtime's HTTP listener, for
        `ttl` seconds (None: an hour; at most 7 days). The app must listen on 0.0.0.0, not only 127.0.0.1.
        InvalidArgument (field `port`) for a port outside 1-65535 or the executor's own; FailedPrecondition
        when the runtime serves no HTTP listener (MENTIS_HTTP_LISTEN unset; embedded mode always has one)."""
        r = _call(self._conn.sandboxes.GetPreviewUrl, _preview_request(self.id, port, ttl))
        return _preview_url(r)

    def revoke_preview_urls(self, port: int | None = None) -> None:
        """Every preview URL of `port` (None: of every port) handed out so far stops opening; URLs asked
        for later work."""
        _call(self._conn.sandboxes.RevokePreviewUrls, _revoke_request(self.id, port))

    def update_egress_rules(self, rules: builtins.list[EgressRule]) -> builtins.list[EgressRule]:
        """Replaces the sandbox's egress rules with `rules` (an empty list: nothing is reachable) and returns
        them as the runtime keeps them (`egress_rules`, which this refreshes). They hold from its next
        connection and DNS question; connections already open stay open. Only a sandbox whose egress is
        `"rules"` has rules: rules for another are InvalidArgument (`field` `sandbox.egress_rules`; change its
        mode with `update_egress`). A rule the runtime refuses is InvalidArgument naming it (`field`
        `sandbox.egress_rules[0].domain`), and the rules stay as they were."""
        request = _update_rules_request(self.id, rules)
        self._info = _call(self._conn.sandboxes.UpdateSandbox, request).sandbox
        return self.egress_rules

    def update_egress(self, egress: str, rules: builtins.list[EgressRule] | None = None) -> Sandbox:
        """Gives the sandbox another egress mode (`"deny"`, `"allow"` or `"rules"`, with `rules` for the
        last) and returns it refreshed. The runtime moves it between networks, off the old way out before
        onto the new; connections through the old way end. Only while it is RUNNING (FailedPrecondition
        otherwise, and on the Kubernetes backend). Within its space's cap (InvalidArgument otherwise)."""
        request = _mode_request(self.id, egress, rules)
        self._info = _call(self._conn.sandboxes.UpdateSandbox, request).sandbox
        return self

    def egress_denials(self) -> builtins.list[EgressDenial]:
        """The connections and DNS questions the egress gateway refused this sandbox lately, oldest first (at
        most the latest 256, since the runtime started). Empty for a sandbox without egress rules."""
        request = sandbox_pb2.ListEgressDenialsRequest(sandbox_id=self.id)
        return [_denial(d) for d in _call(self._conn.sandboxes.ListEgressDenials, request).denials]

    def delete(self) -> None:
        """Deletes the sandbox and everything in it (a sandbox already gone is no error)."""
        with contextlib.suppress(NotFound):
            _call(self._conn.sandboxes.DeleteSandbox, sandbox_pb2.DeleteSandboxRequest(sandbox_id=self.id))

    def close(self) -> None:
        """Closes the connection (the sandbox stays, and so do its terminals, background commands and file
        watches: they are detached, and the watches' readers closed)."""
        try:
            for follower in [*self._open_terminals, *self._open_commands]:
                follower.detach()
            for watch in [*self._open_watches]:
                watch.close()
        finally:
            self._conn.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._owned and not self._keep:
                self.delete()
        finally:
            self.close()

    # --- actions

    @overload
    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str = "",
        session: str = "",
        stdin: bytes = b"",
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        background: Literal[False] = False,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str = "",
        session: str = "",
        stdin: bytes = b"",
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        background: Literal[True],
    ) -> CommandHandle: ...

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str = "",
        session: str = "",
        stdin: bytes = b"",
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        background: bool = False,
    ) -> CommandResult | CommandHandle:
        """Runs `command` with bash and waits for its end; output is passed to `on_stdout` / `on_stderr` as it
        arrives (decoded as UTF-8; a character split across chunks is kept whole). A command that fails is a
        result with its exit code, not an exception. `session` runs it in a persistent shell of that name
        (cd and export carry over). `timeout` is in seconds (None: the runtime's default, 5 minutes; at most
        24 hours).

        `background=True` returns a `CommandHandle` as soon as the runtime has accepted the command (a refusal
        is raised here), without waiting for it to start or end: `wait()` gives this result later, `kill()`
        cancels it, and the callbacks are called from the handle's thread."""
        action = _shell_action(command, timeout, env, cwd, session, stdin)
        if background:
            action_id = str(uuid.uuid4())
            _submit(self._conn, self.id, action, action_id)
            # Execute again with the same id: the runtime runs nothing again and streams its observations
            # from the start.
            stream = _ActionStream(self._conn, self.id, action, action_id)
            return self._track(CommandHandle(stream, on_stdout, on_stderr, wait_open=False))
        stream = _ActionStream(self._conn, self.id, action)
        collect = _CommandCollector(on_stdout, on_stderr)
        for obs in stream:
            collect.feed(obs)
        return collect.result(stream.action_id)

    def attach_command(
        self,
        action_id: str,
        *,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
    ) -> CommandHandle:
        """A command of this sandbox by its action id (`CommandHandle.action_id`, `CommandResult.action_id`),
        running or ended, from this process or another: its output from its start (as far as the sandbox's
        log still holds it) goes to the callbacks, then what follows as it comes, and `wait()` returns its
        result. NotFound (reason `ACTION_NOT_FOUND`) for an id the sandbox does not know (never submitted, or
        older than the 10,000 ended actions it remembers). Returns at the first message of its stream: at
        once for a command that started; for one queued behind the others of its session, at the stream's
        first keepalive (15 s by default)."""
        stream = _ActionStream(self._conn, self.id, None, _command_id(action_id))
        return self._track(CommandHandle(stream, on_stdout, on_stderr, wait_open=True))

    def _track(self, handle: CommandHandle) -> CommandHandle:
        self._open_commands.add(handle)
        return handle

    def run_code(
        self,
        code: str,
        *,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> CellResult:
        """Runs `code` as a cell on the sandbox's IPython kernel (its state carries over from cell to cell)
        and waits for its end; printed text is passed to `on_output` as it arrives. An exception in the cell
        is a result with status `"error"`, not an exception here."""
        action = _cell_action(code, timeout)
        stream = _ActionStream(self._conn, self.id, action)
        collect = _CellCollector(on_output)
        for obs in stream:
            collect.feed(obs)
        return collect.result(stream.action_id)


class Files:
    """The sandbox's files, by path (relative paths are from the workspace)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def read(self, path: str) -> bytes:
        conn = self._sb._conn
        request = file_pb2.ReadFileRequest(sandbox_id=self._sb.id, path=path)
        try:
            return b"".join(r.data for r in conn.files.ReadFile(request))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8")

    def write(self, path: str, data, *, mode: int = 0) -> None:
        """Writes `data` (bytes or str) to `path`, replacing it; parent directories are made."""
        blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        conn = self._sb._conn

        def requests():
            yield file_pb2.WriteFileRequest(
                header=file_pb2.WriteFileHeader(sandbox_id=self._sb.id, path=path, mode=mode)
            )
            for i in range(0, len(blob), _CHUNK):
                yield file_pb2.WriteFileRequest(data=blob[i : i + _CHUNK])

        _call(conn.files.WriteFile, requests())

    def list(self, path: str = "", *, recursive: bool = False) -> builtins.list[FileInfo]:
        conn = self._sb._conn
        files: list[FileInfo] = []
        token = ""
        while True:
            r = _call(
                conn.files.ListFiles,
                file_pb2.ListFilesRequest(
                    sandbox_id=self._sb.id, path=path, recursive=recursive, page_token=token
                ),
            )
            files.extend(_file_info(f) for f in r.files)
            if not r.next_page_token:
                return files
            token = r.next_page_token

    def stat(self, path: str) -> FileInfo:
        """One file, directory or symbolic link (a link is described, not followed); NotFound when missing."""
        conn = self._sb._conn
        r = _call(conn.files.StatFile, file_pb2.StatFileRequest(sandbox_id=self._sb.id, path=path))
        return _file_info(r.file)

    def mkdir(self, path: str, *, mode: int = 0) -> FileInfo:
        """Makes the directory `path` and its missing parents (`mode`: their permission bits; 0 is 0755) and
        returns it; an existing directory is no error, an existing file is."""
        conn = self._sb._conn
        request = file_pb2.MakeDirectoryRequest(sandbox_id=self._sb.id, path=path, mode=mode)
        return _file_info(_call(conn.files.MakeDirectory, request).directory)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, a symbolic link (not what it points to) or an empty directory; with `recursive`
        also a directory with everything in it. NotFound when `path` is missing."""
        conn = self._sb._conn
        request = file_pb2.DeleteFileRequest(sandbox_id=self._sb.id, path=path, recursive=recursive)
        _call(conn.files.DeleteFile, request)

    def rename(self, source: str, destination: str, *, overwrite: bool = False) -> FileInfo:
        """Moves or renames a file, a symbolic link (not its target) or a directory within the workspace in
        one step (rename(2): readers see it at the old path or the new one) and returns what is at
        `destination` now. The destination's parent directory must exist. Something already at `destination`
        is AlreadyExists (reason `PATH_EXISTS`) unless `overwrite`, which replaces a file or link with a file
        or link and an empty directory with a directory (a directory that is not empty: FailedPrecondition; a
        file over a directory or the reverse: InvalidArgument). A directory into itself is InvalidArgument; a
        missing `source` (or parent of `destination`) is NotFound (reason `PATH_NOT_FOUND`)."""
        conn = self._sb._conn
        request = file_pb2.MoveFileRequest(
            sandbox_id=self._sb.id, source=source, destination=destination, overwrite=overwrite
        )
        return _file_info(_call(conn.files.MoveFile, request).file)

    def watch(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        on_event: Callable[[FileEvent], None] | None = None,
    ) -> FileWatch:
        """Starts watching the directory `path` ("" is the workspace) and, with `recursive`, every directory
        under it, also those made later (at most 4096 directories). Every change from when this returns is
        reported, as a `FileEvent`: iterate over the `FileWatch`, `read` it, or pass `on_event` (called from
        the watch's thread). A path that is not a directory is InvalidArgument, a missing one NotFound
        (`PATH_NOT_FOUND`). A sandbox keeps 16 watches: a new one ends the one read least recently that has
        no reader (a watch nobody reads also ends after 5 minutes), and is FailedPrecondition when all 16
        have one."""
        request = _watch_request(self._sb.id, path, recursive)
        return self._track(FileWatch(self._sb._conn, self._sb.id, request, on_event))

    def attach_watch(
        self,
        watch_id: str,
        *,
        after_seq: int = 0,
        on_event: Callable[[FileEvent], None] | None = None,
    ) -> FileWatch:
        """Reads a watch of this sandbox again by its id (`FileWatch.watch_id`), from this process or another:
        its events after `after_seq` (`FileWatch.last_seq` of the reader before; 0: every event still kept)
        first, a `gap` event first when some of them are gone, then live ones. NotFound (`PATH_NOT_FOUND`) for
        a watch that ended (nobody read it for 5 minutes, or the sandbox restarted), OutOfRange
        (`SEQ_OUT_OF_RANGE`) for an `after_seq` beyond its newest event."""
        request = _attach_watch_request(self._sb.id, watch_id, after_seq)
        return self._track(FileWatch(self._sb._conn, self._sb.id, request, on_event))

    def _track(self, watch: FileWatch) -> FileWatch:
        self._sb._open_watches.add(watch)
        return watch

    def _is_dir(self, path: str) -> bool:
        try:
            return self.stat(path).is_dir
        except NotFound:
            return False

    def upload(self, local_path: str | os.PathLike[str], remote_path: str = "") -> str:
        """Copies a local file or directory into the sandbox, as `mentis cp` does, and returns the remote path
        it was copied to.

        A file keeps its permission bits; it lands at `remote_path`, or in it under its own name when
        `remote_path` is "" (the workspace), ends with "/" or is an existing directory. A directory goes as
        a tar archive, streamed as it is read: into `remote_path/<its name>` when `remote_path` is an existing
        directory, else into `remote_path` (made when missing), like `cp -r`; existing files there are
        replaced, others kept. Symbolic links go as links (one that points outside the directory refuses the
        upload: InvalidArgument). Either way the runtime moves the copy in only once it is whole: a refused,
        failed or cancelled upload (a local file that cannot be read) leaves no file of it. A missing local
        path is FileNotFoundError."""
        local = os.fspath(local_path)
        mode = os.stat(local).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise ValueError(f"{local} is neither a file nor a directory")
        conn = self._sb._conn
        remote_is_dir = self._is_dir(remote_path)
        if stat.S_ISDIR(mode):
            dest = _transfer.remote_dir_destination(local, remote_path, remote_is_dir)
            header = file_pb2.UploadHeader(sandbox_id=self._sb.id, path=dest)
            _send(
                conn.files.Upload,
                file_pb2.UploadRequest(header=header),
                _transfer.tar_chunks(local, _CHUNK),
                lambda data: file_pb2.UploadRequest(data=data),
            )
            return dest
        dest = _transfer.remote_file_destination(local, remote_path, remote_is_dir)
        with open(local, "rb") as f:
            header = file_pb2.WriteFileHeader(sandbox_id=self._sb.id, path=dest, mode=stat.S_IMODE(mode))
            _send(
                conn.files.WriteFile,
                file_pb2.WriteFileRequest(header=header),
                _transfer.file_chunks(f, _CHUNK),
                lambda data: file_pb2.WriteFileRequest(data=data),
            )
        return dest

    def download(self, remote_path: str, local_path: str | os.PathLike[str] = ".") -> str:
        """Copies a file or directory of the sandbox to this machine, as `mentis cp` does, and returns the
        local path it was copied to. Both come as a tar archive (Download), unpacked as it arrives, with
        their permission bits and modification times; symbolic links come as links.

        A file lands at `local_path`, or in it under its own name when `local_path` is an existing directory;
        the file is replaced only once it is complete. A directory lands in `local_path/<its name>` when
        `local_path` is an existing directory, else in `local_path` (made when missing), like `cp -r`.
        A missing remote path is NotFound."""
        conn = self._sb._conn
        is_dir = self.stat(remote_path).is_dir
        dest = _transfer.local_destination(remote_path, local_path)
        responses = conn.files.Download(file_pb2.DownloadRequest(sandbox_id=self._sb.id, path=remote_path))
        archive = _transfer.ChunkReader(_data(responses))
        try:
            if is_dir:
                _transfer.unpack(archive, dest, _CHUNK)
            else:
                _transfer.unpack_one(archive, dest, _CHUNK)
        finally:
            responses.cancel()
        return dest


def _data(responses) -> Iterator[bytes]:
    """The data of a stream of chunks, its failure as a typed error."""
    try:
        for r in responses:
            yield r.data
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def _send(method, header, chunks: Iterator[bytes], message: Callable[[bytes], Any]):
    """A client stream: `header`, then a message per chunk, then the clean end that commits it. A chunk that
    cannot be read (a local file) cancels the call instead, so nothing half sent is committed, and its error
    is raised."""
    local: list[BaseException] = []
    ready = threading.Event()
    calls: list[Any] = []

    def requests():
        yield header
        try:
            for chunk in chunks:
                yield message(chunk)
        except Exception as e:
            local.append(e)
            ready.wait()
            calls[0].cancel()

    call = method.future(requests())
    calls.append(call)
    ready.set()
    try:
        return call.result()
    except (grpc.RpcError, grpc.FutureCancelledError) as e:
        if local:
            raise local[0] from None
        if isinstance(e, grpc.RpcError):
            raise from_rpc_error(e) from None
        raise


def _shell_action(
    command: str,
    timeout: float | None,
    env: dict[str, str] | None,
    cwd: str,
    session: str,
    stdin: bytes,
) -> action_pb2.Action:
    return action_pb2.Action(
        shell=action_pb2.ShellAction(
            command=command,
            work_dir=cwd,
            env=env or {},
            timeout_seconds=_whole_seconds(timeout),
            stdin=stdin,
            session=session,
        )
    )


def _cell_action(code: str, timeout: float | None) -> action_pb2.Action:
    return action_pb2.Action(
        ipython=action_pb2.IPythonAction(code=code, timeout_seconds=_whole_seconds(timeout))
    )


class _CommandCollector:
    """A shell action's observations, as they come, into its result (and the output callbacks)."""

    def __init__(self, on_stdout: Callable[[str], None] | None, on_stderr: Callable[[str], None] | None):
        self._out, self._err = bytearray(), bytearray()
        self._decoders = {
            observation_pb2.OUTPUT_STREAM_STDOUT: _Utf8(on_stdout),
            observation_pb2.OUTPUT_STREAM_STDERR: _Utf8(on_stderr),
        }
        self._end: observation_pb2.CmdEnd | None = None

    def feed(self, obs: observation_pb2.Observation) -> None:
        if obs.HasField("cmd_output"):
            data = obs.cmd_output.data
            stdout = obs.cmd_output.stream == observation_pb2.OUTPUT_STREAM_STDOUT
            (self._out if stdout else self._err).extend(data)
            decoder = self._decoders.get(obs.cmd_output.stream)
            if decoder:
                decoder.feed(data)
        elif obs.HasField("cmd_end"):
            self._end = obs.cmd_end

    @property
    def ended(self) -> bool:
        """The command's end (cmd_end) has been fed."""
        return self._end is not None

    def result(self, action_id: str) -> CommandResult:
        for decoder in self._decoders.values():
            decoder.flush()
        end = self._end
        if end is None:
            raise MentisError("the action's stream ended without its end")
        return CommandResult(
            exit_code=end.exit_code,
            reason=_enum_name(observation_pb2.EndReason, end.reason, "END_REASON_"),
            stdout_bytes=bytes(self._out),
            stderr_bytes=bytes(self._err),
            signal=end.signal,
            message=end.message,
            duration=_seconds(end.duration),
            action_id=action_id,
        )


class _CellCollector:
    """A cell's observations, as they come, into its result (and the output callback)."""

    _STREAMS = (
        observation_pb2.IPYTHON_OUTPUT_KIND_STREAM_STDOUT,
        observation_pb2.IPYTHON_OUTPUT_KIND_STREAM_STDERR,
    )

    def __init__(self, on_output: Callable[[str], None] | None) -> None:
        self._on_output = on_output
        self._text: list[str] = []
        self._results: list[dict[str, Any]] = []
        self._end: observation_pb2.IPythonResult | None = None

    def feed(self, obs: observation_pb2.Observation) -> None:
        if obs.HasField("ipython_output"):
            o = obs.ipython_output
            if o.kind in self._STREAMS:
                self._text.append(o.text)
                if self._on_output:
                    self._on_output(o.text)
            else:
                self._results.append(_bundle(o.data))
        elif obs.HasField("ipython_result"):
            self._end = obs.ipython_result

    def result(self, action_id: str) -> CellResult:
        end = self._end
        if end is None:
            raise MentisError("the cell's stream ended without its end")
        status = _enum_name(observation_pb2.IpythonStatus, end.status, "IPYTHON_STATUS_")
        error = CellError(end.error_name, end.error_value, list(end.traceback)) if status == "error" else None
        return CellResult(
            status=status,
            text="".join(self._text),
            results=self._results,
            error=error,
            execution_count=end.execution_count,
            reason=end.reason,
            duration=_seconds(end.duration),
            action_id=action_id,
        )


def _spec(
    space: str,
    key: str,
    *,
    image: str = "",
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    cpu: float = 0.0,
    memory_mb: int = 0,
    idle_timeout: int = 0,
    snapshot_id: str = "",
    template: str = "",
    egress: str | None = None,
    egress_rules: builtins.list[EgressRule] | None = None,
) -> sandbox_pb2.SandboxSpec:
    """The spec of `create` and `get_or_create` (0 / empty / None: the runtime's default). An egress mode
    that is not one is ValueError, a rule that is no EgressRule TypeError, here."""
    rules = _rule_messages(egress_rules)
    return sandbox_pb2.SandboxSpec(
        space_id=space,
        external_key=key,
        image=image,
        env=env or {},
        labels=labels or {},
        cpu_limit=cpu,
        memory_limit_mb=memory_mb,
        idle_timeout_seconds=idle_timeout,
        snapshot_id=snapshot_id,
        template=template,
        egress=_egress_mode(egress, bool(rules)),
        egress_rules=rules,
    )


def _file_info(f: file_pb2.FileInfo) -> FileInfo:
    return FileInfo(
        path=f.path,
        size=f.size,
        mode=f.mode,
        is_dir=f.type == file_pb2.FILE_TYPE_DIRECTORY,
        symlink_target=f.symlink_target,
    )


def _call(method, request):
    try:
        return method(request)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


@contextlib.contextmanager
def _closed_on_error(conn: Connection) -> Iterator[None]:
    """Closes `conn` when the block raises: a call that made no Sandbox leaves no channel open."""
    try:
        yield
    except BaseException:
        conn.close()
        raise


def _bundle(data) -> dict[str, Any]:
    bundle: dict[str, Any] = {}
    for mime, value in data.items():
        if mime.startswith("image/") and mime != "image/svg+xml":
            try:
                bundle[mime] = base64.b64decode(value)
                continue
            except ValueError:
                pass
        bundle[mime] = value
    return bundle


class _Utf8:
    """Decodes a byte stream for a callback, holding back a character split across chunks."""

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        import codecs

        self._sink = sink
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        if self._sink:
            text = self._decoder.decode(data)
            if text:
                self._sink(text)

    def flush(self) -> None:
        if self._sink:
            text = self._decoder.decode(b"", final=True)
            if text:
                self._sink(text)
