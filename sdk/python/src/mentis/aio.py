"""The asyncio API: `AsyncSandbox`, with the names and results of `Sandbox`.

    from mentis.aio import AsyncSandbox

    async with AsyncSandbox.create() as sb:      # or: sb = await AsyncSandbox.create()
        r = await sb.run("echo hi")
        cell = await sb.run_code("6 * 7")

Streams are resumed after a drop and submits retried with their action id, as in the synchronous API.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import stat
import tempfile
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator
from typing import IO, Any, Generic, Literal, TypeVar, overload

import grpc
import grpc.aio

from . import _transfer
from ._client import _MAX_MESSAGE, Settings
from .egress import (
    EgressDenial,
    EgressRule,
    _delete_request,
    _denial,
    _mode_request,
    _rule,
    _set_request,
    _update_rules_request,
)
from .errors import AlreadyExists, Cancelled, MentisError, NotFound, from_rejection, from_rpc_error
from .processes import ProcessInfo, _process_info, _process_signal_request
from .sandbox import (
    _CHUNK,
    _RESUMABLE,
    _RESUME_FOR,
    CellResult,
    CommandResult,
    FileInfo,
    PreviewUrl,
    SandboxInfo,
    _cell_action,
    _CellCollector,
    _command_id,
    _CommandCollector,
    _detached,
    _enum_name,
    _file_info,
    _list_sandboxes_request,
    _preview_request,
    _preview_url,
    _revoke_request,
    _sandbox_info,
    _shell_action,
    _spec,
)
from .snapshot import Snapshot, _create_request, _list_request, _snapshot
from .template import (
    BuiltImage,
    Template,
    _build_header,
    _BuildOutput,
    _built,
    _check_update,
    _context_chunks,
    _rootfs_chunks,
    _template,
    _update_request,
)
from .template import _create_request as _template_create_request
from .template import _list_request as _template_list_request
from .terminal import (
    _CLOSE_WAIT,
    TerminalInfo,
    TerminalLink,
    _attach_request,
    _input_requests,
    _link,
    _Output,
    _resize_request,
    _signal_request,
    _size,
    _start_request,
    _terminal_info,
)
from .v1 import (
    action_pb2,
    action_pb2_grpc,
    file_pb2,
    file_pb2_grpc,
    observation_pb2,
    sandbox_pb2,
    sandbox_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
    space_pb2,
    space_pb2_grpc,
    template_pb2,
    template_pb2_grpc,
    terminal_pb2,
    terminal_pb2_grpc,
)
from .watch import FileEvent, _attach_watch_request, _Events, _watch_request

__all__ = [
    "AsyncCommandHandle",
    "AsyncFileWatch",
    "AsyncFiles",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSecrets",
    "AsyncSnapshots",
    "AsyncTemplates",
    "AsyncTerminal",
    "AsyncTerminals",
]

T = TypeVar("T")


class _AsyncConnection:
    """An asyncio channel to the runtime; the key rides on every call's metadata."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {settings.api_key}"),) if settings.api_key else ()
        )
        self.generation = 0
        self._open()

    def _open(self) -> None:
        s = self.settings
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.keepalive_time_ms", 30_000),
        ]
        if s.tls:
            creds = grpc.ssl_channel_credentials(root_certificates=s.root_certificates)
            self.channel = grpc.aio.secure_channel(s.target, creds, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(s.target, options=options)
        self.sandboxes = sandbox_pb2_grpc.SandboxServiceStub(self.channel)
        self.actions = action_pb2_grpc.ActionServiceStub(self.channel)
        self.files = file_pb2_grpc.FileServiceStub(self.channel)
        self.terminals = terminal_pb2_grpc.TerminalServiceStub(self.channel)
        self.snapshots = snapshot_pb2_grpc.SnapshotServiceStub(self.channel)
        self.templates = template_pb2_grpc.TemplateServiceStub(self.channel)
        self.spaces = space_pb2_grpc.SpaceServiceStub(self.channel)
        self.generation += 1

    async def reconnect(self, seen_generation: int) -> None:
        if self.generation != seen_generation:
            return
        old = self.channel
        self._open()
        await old.close()

    async def call(self, method: Callable[..., Awaitable[T]], request: Any) -> T:
        try:
            return await method(request, metadata=self.metadata)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    async def close(self) -> None:
        await self.channel.close()


async def _observations(
    conn: _AsyncConnection,
    sandbox_id: str,
    action: action_pb2.Action | None,
    action_id: str,
    on_open: Callable[[], None] | None = None,
) -> AsyncIterator[observation_pb2.Observation]:
    """One action's observations, each once, across dropped streams (see `sandbox._ActionStream`; without
    an action, one submitted before, from the start of the log; `on_open` at the stream's first message)."""
    last_seq = 0
    started = action is None
    deadline: float | None = None
    calls: Any = None
    try:
        while True:
            generation = conn.generation
            failure: MentisError
            try:
                if not started:
                    calls = conn.actions.Execute(
                        action_pb2.ExecuteRequest(sandbox_id=sandbox_id, action=action, action_id=action_id),
                        metadata=conn.metadata,
                    )
                else:
                    calls = conn.actions.StreamObservations(
                        action_pb2.StreamObservationsRequest(
                            sandbox_id=sandbox_id, after_seq=last_seq, action_id=action_id
                        ),
                        metadata=conn.metadata,
                    )
                async for response in calls:
                    if on_open is not None:
                        on_open()
                        on_open = None
                    if not response.HasField("observation"):
                        continue
                    obs = response.observation
                    started = True
                    if obs.seq <= last_seq:
                        continue
                    last_seq = obs.seq
                    deadline = None
                    yield obs
                    if obs.HasField("cmd_end") or obs.HasField("ipython_result"):
                        return
                failure = MentisError("the stream ended before the action did")
            except grpc.aio.AioRpcError as e:
                if e.code() not in _RESUMABLE:
                    raise from_rpc_error(e) from None
                failure = from_rpc_error(e)
                await conn.reconnect(generation)
            except asyncio.CancelledError:
                # grpc.aio cancels the calls of a channel that was closed under them. Our own task being
                # cancelled goes on as it should (before Python 3.11 the two cannot be told apart: it always
                # does).
                task = asyncio.current_task()
                if task is None or not hasattr(task, "cancelling") or task.cancelling():
                    raise
                failure = Cancelled("the channel was closed during the call")
                await conn.reconnect(generation)
            now = time.monotonic()
            deadline = deadline or now + _RESUME_FOR
            if now > deadline:
                raise failure
            await asyncio.sleep(0.05)
    finally:
        # Left early (a callback's error, a cancelled task): the call goes with it.
        if calls is not None:
            calls.cancel()


async def _submit(conn: _AsyncConnection, sandbox_id: str, action: action_pb2.Action, action_id: str) -> None:
    """See `sandbox._submit`: returns once the runtime accepted `action` as `action_id`."""
    attach = action_pb2.ConnectRequest(attach=action_pb2.ConnectRequest.Attach(sandbox_id=sandbox_id))
    submit = action_pb2.ConnectRequest(
        submit=action_pb2.ConnectRequest.Submit(action=action, action_id=action_id)
    )
    deadline: float | None = None
    while True:
        generation = conn.generation
        call = conn.actions.Connect(metadata=conn.metadata)
        failure: MentisError
        try:
            with contextlib.suppress(asyncio.InvalidStateError):  # the call ended: the read says why
                await call.write(attach)
                await call.write(submit)
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    failure = MentisError("the stream ended before the submit was answered")
                    break
                kind = response.WhichOneof("kind")
                if kind == "accepted" and response.accepted.action_id == action_id:
                    return
                if kind == "rejected":
                    r = response.rejected
                    failure = from_rejection(r.code, r.message, r.reason)
                    if failure.code != "UNAVAILABLE":
                        raise failure
                    break
        except grpc.aio.AioRpcError as e:
            if e.code() not in _RESUMABLE:
                raise from_rpc_error(e) from None
            failure = from_rpc_error(e)
            await conn.reconnect(generation)
        finally:
            call.cancel()
        now = time.monotonic()
        deadline = deadline or now + _RESUME_FOR
        if now > deadline:
            raise failure
        await asyncio.sleep(0.05)


class AsyncCommandHandle:
    """The asyncio twin of `mentis.CommandHandle` (`wait`, `kill` and `detach` awaited). A task of the handle
    follows the command and calls `on_stdout` / `on_stderr` on the event loop; `detach`, `wait` and the
    sandbox's `close` end it (none is left behind)."""

    def __init__(
        self,
        conn: _AsyncConnection,
        sandbox_id: str,
        action: action_pb2.Action | None,
        action_id: str,
        on_stdout: Callable[[str], None] | None,
        on_stderr: Callable[[str], None] | None,
    ) -> None:
        self._conn = conn
        self._sandbox_id = sandbox_id
        self._action = action
        self.action_id = action_id
        self._collect = _CommandCollector(on_stdout, on_stderr)
        self._opened = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def _start(self, *, wait_open: bool) -> AsyncCommandHandle:
        task = asyncio.get_running_loop().create_task(self._follow())
        self._task = task
        if wait_open:
            opened = asyncio.ensure_future(self._opened.wait())
            try:
                await asyncio.wait({opened, task}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # the caller's cancellation: no task is left following
                task.cancel()
                raise
            finally:
                opened.cancel()
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return self

    async def _follow(self) -> CommandResult:
        """The task: the command's observations into its result and the callbacks."""
        stream = _observations(
            self._conn, self._sandbox_id, self._action, self.action_id, on_open=self._opened.set
        )
        async with contextlib.aclosing(stream):
            async for obs in stream:
                self._collect.feed(obs)
        return self._collect.result(self.action_id)

    def __repr__(self) -> str:
        done = self._task is not None and self._task.done()
        return f"AsyncCommandHandle({self.action_id!r}, done={done!r})"

    async def wait(self, timeout: float | None = None) -> CommandResult:
        """See `CommandHandle.wait`."""
        task = self._task
        assert task is not None
        if not task.done():
            await asyncio.wait({task}, timeout=timeout)  # the caller's cancellation is raised, not the task's
        if not task.done():
            raise TimeoutError(f"command {self.action_id} still runs after {timeout} s")
        if task.cancelled():
            raise _detached(self.action_id)
        return task.result()

    async def kill(self) -> None:
        """See `CommandHandle.kill`."""
        request = action_pb2.CancelActionRequest(sandbox_id=self._sandbox_id, action_id=self.action_id)
        await self._conn.call(self._conn.actions.CancelAction, request)

    async def detach(self) -> None:
        """See `CommandHandle.detach`: its task is cancelled and awaited."""
        task = self._task
        if task is None or task is asyncio.current_task():
            return
        if task.done():
            if not task.cancelled():
                task.exception()  # retrieved: wait() raises it
            return
        task.cancel()
        await asyncio.wait({task})  # the caller's own cancellation is raised here, the task's is not


class _Pending(Generic[T]):
    """What `AsyncSandbox.create` returns: await it for the sandbox, or use it in `async with`."""

    def __init__(self, make: Callable[[], Awaitable[T]]) -> None:
        self._make = make
        self._value: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._make()
        return await self._value.__aenter__()  # type: ignore[attr-defined]

    async def __aexit__(self, *exc: Any) -> None:
        assert self._value is not None
        await self._value.__aexit__(*exc)  # type: ignore[attr-defined]


class AsyncSandbox:
    """The asyncio twin of `mentis.Sandbox` (same arguments, same results)."""

    def __init__(self, conn: _AsyncConnection, info: sandbox_pb2.Sandbox, *, owned: bool, keep: bool = False):
        self._conn = conn
        self._info = info
        self._owned = owned
        self._keep = keep
        self.files = AsyncFiles(self)
        self.terminals = AsyncTerminals(self)
        self.processes = AsyncProcesses(self)
        # Terminals and background commands with a stream on this sandbox's connection, detached when it
        # closes, and watches, closed then.
        self._open_terminals: weakref.WeakSet = weakref.WeakSet()
        self._open_commands: weakref.WeakSet = weakref.WeakSet()
        self._open_watches: weakref.WeakSet = weakref.WeakSet()

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
    ) -> _Pending[AsyncSandbox]:
        """Creates a sandbox: `await` it, or `async with` it (deleted at the end unless `keep=True`). An
        `egress` that is no mode is ValueError here, before any call (see `Sandbox.create`)."""
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

        async def make() -> AsyncSandbox:
            conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))
            try:
                r = await conn.call(conn.sandboxes.CreateSandbox, sandbox_pb2.CreateSandboxRequest(spec=spec))
            except BaseException:
                await conn.close()
                raise
            return cls(conn, r.sandbox, owned=True, keep=keep)

        return _Pending(make)

    @classmethod
    async def connect(
        cls, sandbox_id: str, *, addr: str | None = None, api_key: str | None = None, tls: bool | None = None
    ) -> AsyncSandbox:
        conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))
        try:
            r = await conn.call(
                conn.sandboxes.GetSandbox, sandbox_pb2.GetSandboxRequest(sandbox_id=sandbox_id)
            )
        except BaseException:
            await conn.close()
            raise
        return cls(conn, r.sandbox, owned=False)

    @classmethod
    async def get_or_create(
        cls,
        *,
        key: str,
        space: str = "",
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
        **create_args: Any,
    ) -> AsyncSandbox:
        """See `Sandbox.get_or_create`."""
        spec = _spec(space, key, **create_args)
        conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))
        request = sandbox_pb2.GetSandboxByKeyRequest(space_id=space, external_key=key)
        for _ in range(3):
            try:
                r = await conn.call(conn.sandboxes.GetSandboxByKey, request)
                return cls(conn, r.sandbox, owned=False)
            except NotFound:
                pass
            try:
                r = await conn.call(conn.sandboxes.CreateSandbox, sandbox_pb2.CreateSandboxRequest(spec=spec))
                return cls(conn, r.sandbox, owned=False)
            except AlreadyExists:
                continue
        await conn.close()
        raise MentisError(f"no sandbox with key {key!r} could be found or created")

    @classmethod
    async def list(
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
        """See `Sandbox.list`: every page, oldest first, at most `limit` (0: all)."""
        request = _list_sandboxes_request(space, labels, state, page_size, limit)
        conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))
        found: builtins.list[SandboxInfo] = []
        try:
            while True:
                r = await conn.call(conn.sandboxes.ListSandboxes, request)
                found.extend(_sandbox_info(s) for s in r.sandboxes)
                if limit and len(found) >= limit:
                    return found[:limit]
                if not r.next_page_token:
                    return found
                request.page_token = r.next_page_token
        finally:
            await conn.close()

    @property
    def id(self) -> str:
        return self._info.sandbox_id

    @property
    def state(self) -> str:
        return _enum_name(sandbox_pb2.SandboxState, self._info.state, "SANDBOX_STATE_")

    @property
    def template(self) -> str:
        """See `Sandbox.template`."""
        return self._info.template

    @property
    def work_dir(self) -> str:
        """See `Sandbox.work_dir`."""
        return self._info.work_dir

    @property
    def egress(self) -> str:
        """See `Sandbox.egress`."""
        return _enum_name(sandbox_pb2.Egress, self._info.egress, "EGRESS_")

    @property
    def egress_rules(self) -> builtins.list[EgressRule]:
        """See `Sandbox.egress_rules`."""
        return [_rule(r) for r in self._info.egress_rules]

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, state={self.state!r})"

    async def refresh(self) -> AsyncSandbox:
        r = await self._conn.call(
            self._conn.sandboxes.GetSandbox, sandbox_pb2.GetSandboxRequest(sandbox_id=self.id)
        )
        self._info = r.sandbox
        return self

    async def pause(self) -> AsyncSandbox:
        r = await self._conn.call(
            self._conn.sandboxes.PauseSandbox, sandbox_pb2.PauseSandboxRequest(sandbox_id=self.id)
        )
        self._info = r.sandbox
        return self

    async def resume(self) -> AsyncSandbox:
        r = await self._conn.call(
            self._conn.sandboxes.ResumeSandbox, sandbox_pb2.ResumeSandboxRequest(sandbox_id=self.id)
        )
        self._info = r.sandbox
        return self

    async def snapshot(self, *, labels: dict[str, str] | None = None) -> Snapshot:
        """See `Sandbox.snapshot`."""
        r = await self._conn.call(self._conn.snapshots.CreateSnapshot, _create_request(self.id, labels))
        return _snapshot(r.snapshot)

    async def preview_url(self, port: int, ttl: float | None = None) -> PreviewUrl:
        """See `Sandbox.preview_url`."""
        r = await self._conn.call(self._conn.sandboxes.GetPreviewUrl, _preview_request(self.id, port, ttl))
        return _preview_url(r)

    async def revoke_preview_urls(self, port: int | None = None) -> None:
        """See `Sandbox.revoke_preview_urls`."""
        await self._conn.call(self._conn.sandboxes.RevokePreviewUrls, _revoke_request(self.id, port))

    async def update_egress_rules(self, rules: builtins.list[EgressRule]) -> builtins.list[EgressRule]:
        """See `Sandbox.update_egress_rules`."""
        request = _update_rules_request(self.id, rules)
        self._info = (await self._conn.call(self._conn.sandboxes.UpdateSandbox, request)).sandbox
        return self.egress_rules

    async def update_egress(
        self, egress: str, rules: builtins.list[EgressRule] | None = None
    ) -> AsyncSandbox:
        """See `Sandbox.update_egress`."""
        request = _mode_request(self.id, egress, rules)
        self._info = (await self._conn.call(self._conn.sandboxes.UpdateSandbox, request)).sandbox
        return self

    async def egress_denials(self) -> builtins.list[EgressDenial]:
        """See `Sandbox.egress_denials`."""
        request = sandbox_pb2.ListEgressDenialsRequest(sandbox_id=self.id)
        r = await self._conn.call(self._conn.sandboxes.ListEgressDenials, request)
        return [_denial(d) for d in r.denials]

    async def delete(self) -> None:
        with contextlib.suppress(NotFound):
            await self._conn.call(
                self._conn.sandboxes.DeleteSandbox, sandbox_pb2.DeleteSandboxRequest(sandbox_id=self.id)
            )

    async def close(self) -> None:
        """Closes the connection (the sandbox stays, and so do its terminals, background commands and file
        watches: they are detached, and the watches' readers closed)."""
        try:
            for follower in [*self._open_terminals, *self._open_commands]:
                await follower.detach()
            for watch in [*self._open_watches]:
                await watch.close()
        finally:
            await self._conn.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            if self._owned and not self._keep:
                await self.delete()
        finally:
            await self.close()

    @overload
    async def run(
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
    async def run(
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
    ) -> AsyncCommandHandle: ...

    async def run(
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
    ) -> CommandResult | AsyncCommandHandle:
        """See `Sandbox.run`; with `background=True`, an `AsyncCommandHandle` once the runtime accepted the
        command (the callbacks are called on the event loop)."""
        action = _shell_action(command, timeout, env, cwd, session, stdin)
        action_id = str(uuid.uuid4())
        if background:
            await _submit(self._conn, self.id, action, action_id)
            handle = AsyncCommandHandle(self._conn, self.id, action, action_id, on_stdout, on_stderr)
            return await self._track(handle, wait_open=False)
        collect = _CommandCollector(on_stdout, on_stderr)
        async for obs in _observations(self._conn, self.id, action, action_id):
            collect.feed(obs)
        return collect.result(action_id)

    async def attach_command(
        self,
        action_id: str,
        *,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
    ) -> AsyncCommandHandle:
        """See `Sandbox.attach_command`."""
        handle = AsyncCommandHandle(self._conn, self.id, None, _command_id(action_id), on_stdout, on_stderr)
        return await self._track(handle, wait_open=True)

    async def _track(self, handle: AsyncCommandHandle, *, wait_open: bool) -> AsyncCommandHandle:
        await handle._start(wait_open=wait_open)
        self._open_commands.add(handle)
        return handle

    async def run_code(
        self, code: str, *, timeout: float | None = None, on_output: Callable[[str], None] | None = None
    ) -> CellResult:
        """See `Sandbox.run_code`."""
        action = _cell_action(code, timeout)
        action_id = str(uuid.uuid4())
        collect = _CellCollector(on_output)
        async for obs in _observations(self._conn, self.id, action, action_id):
            collect.feed(obs)
        return collect.result(action_id)


class AsyncSnapshots:
    """The asyncio twin of `mentis.Snapshots` (same arguments, same results): `await snapshots.get(id)`, and
    `async with AsyncSnapshots() as snapshots` closes its connection at the end of the block."""

    def __init__(self, *, addr: str | None = None, api_key: str | None = None, tls: bool | None = None):
        self._conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))

    async def create(self, sandbox_id: str, *, labels: dict[str, str] | None = None) -> Snapshot:
        r = await self._conn.call(self._conn.snapshots.CreateSnapshot, _create_request(sandbox_id, labels))
        return _snapshot(r.snapshot)

    async def get(self, snapshot_id: str) -> Snapshot:
        request = snapshot_pb2.GetSnapshotRequest(snapshot_id=snapshot_id)
        return _snapshot((await self._conn.call(self._conn.snapshots.GetSnapshot, request)).snapshot)

    async def list(
        self,
        *,
        sandbox_id: str = "",
        space: str = "",
        labels: dict[str, str] | None = None,
        page_size: int = 0,
        limit: int = 0,
    ) -> builtins.list[Snapshot]:
        """See `Snapshots.list`: every page, newest first, at most `limit` (0: all)."""
        request = _list_request(sandbox_id, space, labels, page_size, limit)
        found: builtins.list[Snapshot] = []
        while True:
            r = await self._conn.call(self._conn.snapshots.ListSnapshots, request)
            found.extend(_snapshot(s) for s in r.snapshots)
            if limit and len(found) >= limit:
                return found[:limit]
            if not r.next_page_token:
                return found
            request.page_token = r.next_page_token

    async def delete(self, snapshot_id: str) -> None:
        request = snapshot_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id)
        await self._conn.call(self._conn.snapshots.DeleteSnapshot, request)

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> AsyncSnapshots:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSecrets:
    """The asyncio twin of `mentis.Secrets` (same arguments, same results): `await secrets.set(name, value)`,
    and `async with AsyncSecrets() as secrets` closes its connection at the end of the block."""

    def __init__(
        self,
        *,
        space_id: str | None = None,
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
    ):
        self.space_id = space_id or ""
        self._conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))

    async def set(self, name: str, value: str) -> None:
        """See `Secrets.set`."""
        await self._conn.call(self._conn.spaces.SetSecret, _set_request(self.space_id, name, value))

    async def list(self) -> builtins.list[str]:
        """See `Secrets.list`: names only, in name order."""
        request = space_pb2.ListSecretsRequest(space_id=self.space_id)
        return builtins.list((await self._conn.call(self._conn.spaces.ListSecrets, request)).names)

    async def delete(self, name: str) -> None:
        """See `Secrets.delete`."""
        await self._conn.call(self._conn.spaces.DeleteSecret, _delete_request(self.space_id, name))

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> AsyncSecrets:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncTemplates:
    """The asyncio twin of `mentis.Templates` (same arguments, same results): `await templates.get(name)`, and
    `async with AsyncTemplates() as templates` closes its connection at the end of the block. Local files (a
    build context, a root filesystem) are read off the event loop; `on_output` is called on it."""

    def __init__(self, *, addr: str | None = None, api_key: str | None = None, tls: bool | None = None):
        self._conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))

    async def create(
        self,
        name: str,
        *,
        space_id: str | None = None,
        image: str = "",
        description: str = "",
        env: dict[str, str] | None = None,
        cpu: float = 0,
        memory_mb: int = 0,
        pids: int = 0,
        nofile: int = 0,
        disk_mb: int = 0,
        work_dir: str = "",
        setup_commands: builtins.list[str] | None = None,
        pool_size: int = 0,
        runtime_class: str = "",
    ) -> Template:
        """See `Templates.create`."""
        fields = dict(
            image=image,
            description=description,
            env=env,
            cpu=cpu,
            memory_mb=memory_mb,
            pids=pids,
            nofile=nofile,
            disk_mb=disk_mb,
            work_dir=work_dir,
            setup_commands=setup_commands,
            pool_size=pool_size,
            runtime_class=runtime_class,
        )
        request = _template_create_request(name, space_id, fields)
        return _template((await self._conn.call(self._conn.templates.CreateTemplate, request)).template)

    async def get(self, name: str, space_id: str | None = None) -> Template:
        """See `Templates.get`."""
        request = template_pb2.GetTemplateRequest(space_id=space_id or "", name=name)
        return _template((await self._conn.call(self._conn.templates.GetTemplate, request)).template)

    async def list(self, space_id: str | None = None, *, page_size: int = 0) -> builtins.list[Template]:
        """See `Templates.list`: every page, in name order."""
        request = _template_list_request(space_id, page_size)
        found: builtins.list[Template] = []
        while True:
            r = await self._conn.call(self._conn.templates.ListTemplates, request)
            found.extend(_template(t) for t in r.templates)
            if not r.next_page_token:
                return found
            request.page_token = r.next_page_token

    async def update(self, name: str, *, space_id: str | None = None, **fields: Any) -> Template:
        """See `Templates.update`: only the fields given change."""
        current = await self.get(name, space_id) if _check_update(fields) else None
        request = _update_request(name, space_id, fields, current)
        return _template((await self._conn.call(self._conn.templates.UpdateTemplate, request)).template)

    async def delete(self, name: str, space_id: str | None = None) -> None:
        """See `Templates.delete`."""
        request = template_pb2.DeleteTemplateRequest(space_id=space_id or "", name=name)
        await self._conn.call(self._conn.templates.DeleteTemplate, request)

    async def build_image(
        self,
        context: str | os.PathLike[str],
        tag: str,
        *,
        dockerfile: str = "Dockerfile",
        build_args: dict[str, str] | None = None,
        no_cache: bool = False,
        on_output: Callable[[str], None] | None = None,
        space_id: str | None = None,
        egress: bool = False,
    ) -> BuiltImage:
        """See `Templates.build_image`. The context is sent whole before the output comes (the runtime builds
        once it has all of it)."""
        chunks = _context_chunks(context)
        header = _build_header(tag, dockerfile, build_args, no_cache, space_id, egress)
        loop = asyncio.get_running_loop()
        end = object()
        conn = self._conn
        call = conn.templates.BuildImage(metadata=conn.metadata)
        output = _BuildOutput(on_output)
        try:
            try:
                await call.write(template_pb2.BuildImageRequest(header=header))
                while True:
                    chunk = await loop.run_in_executor(None, next, chunks, end)
                    if chunk is end:
                        break
                    await call.write(template_pb2.BuildImageRequest(context=chunk))
                await call.done_writing()
            except asyncio.InvalidStateError:
                pass  # the runtime ended the call early (it refused the stream): the read says why
            while True:
                r = await call.read()
                if r is grpc.aio.EOF:
                    break
                output.feed(r)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()  # a local file that cannot be read, the callback's error, a cancelled task
            raise
        return output.result()

    async def import_image(
        self,
        rootfs: str | os.PathLike[str] | bytes | IO[bytes],
        tag: str,
        *,
        changes: builtins.list[str] | None = None,
        space_id: str | None = None,
    ) -> BuiltImage:
        """See `Templates.import_image`."""
        chunks, close = _rootfs_chunks(rootfs)
        header = template_pb2.ImportImageHeader(image=tag, changes=changes or [], space_id=space_id or "")
        try:
            r = await _send(
                self._conn,
                self._conn.templates.ImportImage,
                template_pb2.ImportImageRequest(header=header),
                chunks,
                lambda data: template_pb2.ImportImageRequest(data=data),
            )
        finally:
            close()
        return _built(r.image)

    async def share_image(self, tag: str, shared: bool = True) -> BuiltImage:
        """See `Templates.share_image`."""
        request = template_pb2.ShareImageRequest(image=tag, shared=shared)
        r = await self._conn.call(self._conn.templates.ShareImage, request)
        return _built(r.image)

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> AsyncTemplates:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncFiles:
    """See `mentis.Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def read(self, path: str) -> bytes:
        conn = self._sb._conn
        request = file_pb2.ReadFileRequest(sandbox_id=self._sb.id, path=path)
        chunks = []
        try:
            async for r in conn.files.ReadFile(request, metadata=conn.metadata):
                chunks.append(r.data)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        return b"".join(chunks)

    async def read_text(self, path: str) -> str:
        return (await self.read(path)).decode("utf-8")

    async def write(self, path: str, data: bytes | str, *, mode: int = 0) -> None:
        blob = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        conn = self._sb._conn
        sandbox_id = self._sb.id

        async def requests() -> AsyncIterator[file_pb2.WriteFileRequest]:
            yield file_pb2.WriteFileRequest(
                header=file_pb2.WriteFileHeader(sandbox_id=sandbox_id, path=path, mode=mode)
            )
            for i in range(0, len(blob), _CHUNK):
                yield file_pb2.WriteFileRequest(data=blob[i : i + _CHUNK])

        try:
            await conn.files.WriteFile(requests(), metadata=conn.metadata)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    async def list(self, path: str = "", *, recursive: bool = False) -> builtins.list[FileInfo]:
        conn = self._sb._conn
        files: builtins.list[FileInfo] = []
        token = ""
        while True:
            r = await conn.call(
                conn.files.ListFiles,
                file_pb2.ListFilesRequest(
                    sandbox_id=self._sb.id, path=path, recursive=recursive, page_token=token
                ),
            )
            files.extend(_file_info(f) for f in r.files)
            if not r.next_page_token:
                return files
            token = r.next_page_token

    async def stat(self, path: str) -> FileInfo:
        """See `Files.stat`."""
        conn = self._sb._conn
        r = await conn.call(conn.files.StatFile, file_pb2.StatFileRequest(sandbox_id=self._sb.id, path=path))
        return _file_info(r.file)

    async def mkdir(self, path: str, *, mode: int = 0) -> FileInfo:
        """See `Files.mkdir`."""
        conn = self._sb._conn
        request = file_pb2.MakeDirectoryRequest(sandbox_id=self._sb.id, path=path, mode=mode)
        return _file_info((await conn.call(conn.files.MakeDirectory, request)).directory)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """See `Files.remove`."""
        conn = self._sb._conn
        request = file_pb2.DeleteFileRequest(sandbox_id=self._sb.id, path=path, recursive=recursive)
        await conn.call(conn.files.DeleteFile, request)

    async def rename(self, source: str, destination: str, *, overwrite: bool = False) -> FileInfo:
        """See `Files.rename`."""
        conn = self._sb._conn
        request = file_pb2.MoveFileRequest(
            sandbox_id=self._sb.id, source=source, destination=destination, overwrite=overwrite
        )
        return _file_info((await conn.call(conn.files.MoveFile, request)).file)

    def watch(
        self,
        path: str = "",
        *,
        recursive: bool = False,
        on_event: Callable[[FileEvent], None] | None = None,
    ) -> _Pending[AsyncFileWatch]:
        """See `Files.watch`: awaited, or used in `async with` (closed at the end)."""
        request = _watch_request(self._sb.id, path, recursive)
        return _Pending(lambda: self._track(request, on_event))

    def attach_watch(
        self,
        watch_id: str,
        *,
        after_seq: int = 0,
        on_event: Callable[[FileEvent], None] | None = None,
    ) -> _Pending[AsyncFileWatch]:
        """See `Files.attach_watch`: awaited, or used in `async with`."""
        request = _attach_watch_request(self._sb.id, watch_id, after_seq)
        return _Pending(lambda: self._track(request, on_event))

    async def _track(
        self, request: file_pb2.WatchFilesRequest, on_event: Callable[[FileEvent], None] | None
    ) -> AsyncFileWatch:
        watch = await AsyncFileWatch(self._sb._conn, self._sb.id, request, on_event)._start()
        self._sb._open_watches.add(watch)
        return watch

    async def _is_dir(self, path: str) -> bool:
        try:
            return (await self.stat(path)).is_dir
        except NotFound:
            return False

    async def upload(self, local_path: str | os.PathLike[str], remote_path: str = "") -> str:
        """See `Files.upload` (local files are read off the event loop)."""
        local = os.fspath(local_path)
        mode = os.stat(local).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise ValueError(f"{local} is neither a file nor a directory")
        conn = self._sb._conn
        remote_is_dir = await self._is_dir(remote_path)
        if stat.S_ISDIR(mode):
            dest = _transfer.remote_dir_destination(local, remote_path, remote_is_dir)
            header = file_pb2.UploadHeader(sandbox_id=self._sb.id, path=dest)
            await _send(
                conn,
                conn.files.Upload,
                file_pb2.UploadRequest(header=header),
                _transfer.tar_chunks(local, _CHUNK),
                lambda data: file_pb2.UploadRequest(data=data),
            )
            return dest
        dest = _transfer.remote_file_destination(local, remote_path, remote_is_dir)
        with open(local, "rb") as f:
            header = file_pb2.WriteFileHeader(sandbox_id=self._sb.id, path=dest, mode=stat.S_IMODE(mode))
            await _send(
                conn,
                conn.files.WriteFile,
                file_pb2.WriteFileRequest(header=header),
                _transfer.file_chunks(f, _CHUNK),
                lambda data: file_pb2.WriteFileRequest(data=data),
            )
        return dest

    async def download(self, remote_path: str, local_path: str | os.PathLike[str] = ".") -> str:
        """See `Files.download`. The archive is spooled to an unnamed temporary file beside the destination
        as it arrives, then unpacked off the event loop."""
        conn = self._sb._conn
        is_dir = (await self.stat(remote_path)).is_dir
        dest = _transfer.local_destination(remote_path, local_path)
        parent = os.path.dirname(os.path.abspath(dest))
        os.makedirs(parent, exist_ok=True)
        call = conn.files.Download(
            file_pb2.DownloadRequest(sandbox_id=self._sb.id, path=remote_path), metadata=conn.metadata
        )
        with tempfile.TemporaryFile(dir=parent) as spool:
            try:
                async for r in call:
                    spool.write(r.data)
            except grpc.aio.AioRpcError as e:
                raise from_rpc_error(e) from None
            finally:
                call.cancel()
            spool.seek(0)
            unpack = _transfer.unpack if is_dir else _transfer.unpack_one
            await asyncio.get_running_loop().run_in_executor(None, unpack, spool, dest, _CHUNK)
        return dest


async def _send(
    conn: _AsyncConnection, method: Any, header: Any, chunks: Iterator[bytes], message: Callable[[bytes], Any]
) -> Any:
    """A client stream: `header`, then a message per chunk (read off the event loop), then the clean end that
    commits it. An error on this side (a local file that cannot be read, a cancelled task) cancels the call
    instead, so nothing half sent is committed."""
    loop = asyncio.get_running_loop()
    end = object()
    call = method(metadata=conn.metadata)
    try:
        await call.write(header)
        while True:
            chunk = await loop.run_in_executor(None, next, chunks, end)
            if chunk is end:
                break
            await call.write(message(chunk))
        await call.done_writing()
        return await call
    except grpc.aio.AioRpcError as e:
        raise from_rpc_error(e) from None
    except asyncio.InvalidStateError:
        # The runtime ended the call early (it refused the stream): its status says why.
        try:
            await call
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        raise MentisError("the call ended before the whole stream was sent") from None
    except BaseException:
        call.cancel()
        raise


class _Changes:
    """Waiting for a stream's reader task to change something: `_notify` wakes every `_until`. The class sets
    `self._changed = asyncio.Event()` in its constructor."""

    _changed: asyncio.Event

    def _notify(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    async def _until(self, ready: Callable[[], Any], timeout: float | None) -> bool:
        """Waits until `ready()` (False when `timeout` seconds passed first)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not ready():
            changed = self._changed
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), left)
        return True


class AsyncFileWatch(_Changes):
    """The asyncio twin of `mentis.FileWatch`: the same names, awaited (`async for` gives the events as they
    come, `async with` closes it at the end). A task of the watch reads its stream and opens it again after a
    drop; `on_event` is called on the event loop. `close()` (and the sandbox's) cancels the task and awaits
    it."""

    def __init__(
        self,
        conn: _AsyncConnection,
        sandbox_id: str,
        request: file_pb2.WatchFilesRequest,
        on_event: Callable[[FileEvent], None] | None = None,
    ) -> None:
        self._conn = conn
        self._sandbox_id = sandbox_id
        self._request = request
        self._events = _Events(on_event, request.after_seq)
        self._changed = asyncio.Event()
        self._call: Any = None
        self._task: asyncio.Task | None = None
        self.watch_id = ""

    async def _start(self) -> AsyncFileWatch:
        self.watch_id = (await self._open(self._request)).watch_id
        self._task = asyncio.get_running_loop().create_task(self._read_stream())
        return self

    # --- the stream

    async def _open(self, request: file_pb2.WatchFilesRequest) -> file_pb2.WatchFilesResponse.Started:
        call = self._conn.files.WatchFiles(request, metadata=self._conn.metadata)
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise MentisError("the watch's stream ended before it started")
                if response.HasField("started"):
                    break
        except grpc.aio.AioRpcError as e:
            call.cancel()
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()
            raise
        self._call = call
        return response.started

    async def _read_stream(self) -> None:
        """The reading task (see `FileWatch._read_stream`)."""
        try:
            await self._follow()
        except asyncio.CancelledError:
            self._end(None if self._events.closed else Cancelled(f"watch {self.watch_id} was cancelled"))
            raise
        finally:
            self._call.cancel()

    async def _follow(self) -> None:
        deadline: float | None = None
        while True:
            generation = self._conn.generation
            failure: MentisError
            try:
                while True:
                    response = await self._call.read()
                    if response is grpc.aio.EOF or self._events.closed:
                        break
                    event = self._events.feed(response)
                    if event is not None:
                        deadline = None
                        self._notify()
                        if self._events.on_event is not None:
                            self._events.on_event(event)
                self._end()  # closed, or the runtime ended the stream: the watch ended
                return
            except grpc.aio.AioRpcError as e:
                if self._events.closed:
                    self._end()
                    return
                if e.code() not in _RESUMABLE:
                    self._end(from_rpc_error(e))
                    return
                failure = from_rpc_error(e)
                await self._conn.reconnect(generation)
            except asyncio.CancelledError:
                # As in `_observations`: a channel closed under the call, or this task being cancelled (by
                # `close`, or from outside).
                task = asyncio.current_task()
                ours = task is None or not hasattr(task, "cancelling") or task.cancelling()
                if ours or self._events.closed:
                    raise
                failure = Cancelled("the channel was closed during the call")
                await self._conn.reconnect(generation)
            except Exception as e:  # on_event's error: the watch's failure
                self._end(e)
                return
            while True:
                now = time.monotonic()
                deadline = deadline or now + _RESUME_FOR
                if self._events.closed:
                    self._end()
                    return
                if now > deadline:
                    self._end(failure)
                    return
                await asyncio.sleep(0.05)
                request = _attach_watch_request(self._sandbox_id, self.watch_id, self._events.last_seq)
                try:
                    await self._open(request)
                except MentisError as e:
                    if e.code not in ("UNAVAILABLE", "CANCELLED"):
                        self._end(e)
                        return
                    failure = e
                    continue
                deadline = None
                break

    def _end(self, failure: BaseException | None = None) -> None:
        self._events.end(failure)
        self._notify()

    # --- what it is

    @property
    def last_seq(self) -> int:
        """See `FileWatch.last_seq`."""
        return self._events.last_seq

    def __repr__(self) -> str:
        return f"AsyncFileWatch({self.watch_id!r}, last_seq={self.last_seq!r})"

    # --- its events

    async def read(self, timeout: float | None = None) -> builtins.list[FileEvent]:
        """See `FileWatch.read`."""
        self._events.check_readable()
        await self._until(lambda: self._events.buffer or self._events.done, timeout)
        if self._events.buffer:
            return self._events.take()
        if self._events.failure is not None:
            raise self._events.failure
        return []

    def __aiter__(self) -> AsyncIterator[FileEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[FileEvent]:
        """See `FileWatch.__iter__`."""
        while True:
            self._events.check_readable()
            await self._until(lambda: self._events.buffer or self._events.done, None)
            if not self._events.buffer:
                if self._events.failure is not None:
                    raise self._events.failure
                return
            yield self._events.buffer.pop(0)

    async def wait(self, timeout: float | None = None) -> None:
        """See `FileWatch.wait`."""
        if not await self._until(lambda: self._events.done, timeout):
            raise TimeoutError(f"watch {self.watch_id} still runs after {timeout} s")
        if self._events.failure is not None:
            raise self._events.failure

    # --- the end

    async def close(self) -> None:
        """See `FileWatch.close`: its task is cancelled and awaited."""
        self._events.closed = True
        if self._call is not None:
            self._call.cancel()
        task = self._task
        if task is None or task is asyncio.current_task():
            return
        if task.done():
            return
        task.cancel()
        await asyncio.wait({task})  # the caller's own cancellation is raised here, the task's is not

    async def __aenter__(self) -> AsyncFileWatch:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncProcesses:
    """See `mentis.Processes` (the same names, awaited)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def list(self) -> builtins.list[ProcessInfo]:
        """See `Processes.list`."""
        conn = self._sb._conn
        request = action_pb2.ListProcessesRequest(sandbox_id=self._sb.id)
        return [_process_info(p) for p in (await conn.call(conn.actions.ListProcesses, request)).processes]

    async def send_signal(self, pid: int, signal: str) -> None:
        """See `Processes.send_signal`."""
        conn = self._sb._conn
        await conn.call(conn.actions.SignalProcess, _process_signal_request(self._sb.id, pid, signal))

    async def kill(self, pid: int) -> None:
        """See `Processes.kill`."""
        await self.send_signal(pid, "KILL")


class AsyncTerminal(_Changes):
    """The asyncio twin of `mentis.Terminal`: the same names, awaited (`async for` reads the output, `async
    with` closes it at the end). The `on_output` callback is called on the event loop."""

    def __init__(
        self, conn: _AsyncConnection, sandbox_id: str, on_output: Callable[[bytes], None] | None = None
    ) -> None:
        self._conn = conn
        self._sandbox_id = sandbox_id
        self._out = _Output(on_output)
        self._changed = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._call: Any = None
        self._stream = 0  # counts the streams this terminal has had
        self._task: asyncio.Task | None = None
        self.id = ""
        self._rows = self._cols = 0

    async def _start(self, first: terminal_pb2.OpenRequest) -> AsyncTerminal:
        started = await self._open_stream(first)
        self.id = started.terminal_id
        self._rows, self._cols = started.rows, started.cols
        self._task = asyncio.get_running_loop().create_task(self._read_stream())
        return self

    # --- the stream

    async def _open_stream(self, first: terminal_pb2.OpenRequest) -> terminal_pb2.OpenResponse.Started:
        call = self._conn.terminals.Open(metadata=self._conn.metadata)
        try:
            await call.write(first)
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise MentisError("the terminal's stream ended before it started")
                if response.HasField("started"):
                    break
        except grpc.aio.AioRpcError as e:
            call.cancel()
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()
            raise
        self._call = call
        self._stream += 1
        self._notify()
        return response.started

    async def _read_stream(self) -> None:
        """The reading task (see `Terminal._read_stream`)."""
        deadline: float | None = None
        while True:
            generation = self._conn.generation
            failure: MentisError
            try:
                if await self._follow():
                    return
                failure = MentisError(f"terminal {self.id}'s stream ended before its program")
            except grpc.aio.AioRpcError as e:
                if self._out.detached:
                    self._end()
                    return
                if e.code() not in _RESUMABLE:
                    self._end(failure=from_rpc_error(e))
                    return
                failure = from_rpc_error(e)
                await self._conn.reconnect(generation)
            except asyncio.CancelledError:
                if self._out.detached:
                    self._end()
                    return
                # As in `_observations`: a channel closed under the call, or this task being cancelled.
                task = asyncio.current_task()
                if task is None or not hasattr(task, "cancelling") or task.cancelling():
                    self._call.cancel()
                    self._end(failure=Cancelled(f"terminal {self.id}'s stream was cancelled"))
                    raise
                failure = Cancelled("the channel was closed during the call")
                await self._conn.reconnect(generation)
            except Exception as e:  # the callback's or a listing's error: the terminal's failure
                self._call.cancel()
                self._end(failure=e)
                return
            while True:
                now = time.monotonic()
                deadline = deadline or now + _RESUME_FOR
                if self._out.detached:
                    self._end()
                    return
                if now > deadline:
                    self._end(failure=failure)
                    return
                await asyncio.sleep(0.05)
                try:
                    started = await self._open_stream(
                        _attach_request(self._sandbox_id, self.id, self._out.last_seq)
                    )
                except MentisError as e:
                    if e.code not in ("UNAVAILABLE", "CANCELLED"):
                        self._end(failure=e)
                        return
                    failure = e
                    continue
                if self._out.detached:  # detached while it attached again
                    self._call.cancel()
                    self._end()
                    return
                if (started.rows, started.cols) != (self._rows, self._cols):
                    with contextlib.suppress(Exception):
                        await self._call.write(_resize_request(self._rows, self._cols))
                deadline = None
                break

    async def _follow(self) -> bool:
        while True:
            response = await self._call.read()
            if response is grpc.aio.EOF:
                break
            kind = response.WhichOneof("kind")
            if kind == "output":
                data = self._out.feed(response.output)
                self._notify()
                if data and self._out.on_output is not None:
                    self._out.on_output(data)
            elif kind == "exited":
                self._end(exit_code=response.exited.exit_code, signal=response.exited.signal)
                return True
        if self._out.detached:
            self._end()
            return True
        known = await self._exit_from_list()
        if known is not None:
            self._end(exit_code=known)
            return True
        return False

    async def _exit_from_list(self) -> int | None:
        request = terminal_pb2.ListTerminalsRequest(sandbox_id=self._sandbox_id)
        try:
            listed = (
                await self._conn.terminals.ListTerminals(request, metadata=self._conn.metadata)
            ).terminals
        except grpc.aio.AioRpcError as e:
            if e.code() in _RESUMABLE:
                return None
            raise from_rpc_error(e) from None
        for t in listed:
            if t.terminal_id == self.id:
                return t.exit_code if t.HasField("exit_code") else None
        raise NotFound(f"terminal {self.id} is gone", reason="TERMINAL_NOT_FOUND")

    def _end(self, *, exit_code: int | None = None, signal: int = 0, failure: BaseException | None = None):
        if exit_code is not None:
            self._out.exit_code, self._out.signal = exit_code, signal
        self._out.failure = failure
        self._out.done = True
        self._notify()

    async def _send(self, *requests: terminal_pb2.OpenRequest) -> None:
        for request in requests:
            while True:
                self._out.check_open(self.id)
                call, stream = self._call, self._stream
                try:
                    async with self._write_lock:
                        await call.write(request)
                    break
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    # The stream is gone: the reading task attaches again (or ends the terminal).
                    await self._until(lambda s=stream: self._stream != s or self._out.done, None)

    # --- what it is

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self._cols

    @property
    def exit_code(self) -> int | None:
        return self._out.exit_code

    @property
    def signal(self) -> int:
        return self._out.signal

    @property
    def last_seq(self) -> int:
        return self._out.last_seq

    def __repr__(self) -> str:
        return f"AsyncTerminal({self.id!r}, exit_code={self.exit_code!r})"

    # --- input

    async def write(self, data: bytes | str) -> None:
        """See `Terminal.write`."""
        await self._send(*_input_requests(data))

    async def resize(self, rows: int, cols: int) -> None:
        """See `Terminal.resize`."""
        rows, cols = _size(rows, cols, zero_ok=False)
        await self._send(_resize_request(rows, cols))
        self._rows, self._cols = rows, cols

    async def send_signal(self, name: str) -> None:
        """See `Terminal.send_signal`."""
        await self._send(_signal_request(name))

    # --- output

    async def read(self, timeout: float | None = None) -> bytes:
        """See `Terminal.read`."""
        self._out.check_readable()
        await self._until(lambda: self._out.buffer or self._out.done, timeout)
        if self._out.buffer:
            return self._out.take()
        if self._out.done and self._out.failure is not None:
            raise self._out.failure
        return b""

    async def read_until(self, marker: bytes | str, timeout: float | None = 30.0) -> bytes:
        """See `Terminal.read_until`."""
        self._out.check_readable()
        want = marker.encode("utf-8") if isinstance(marker, str) else bytes(marker)
        if not await self._until(lambda: want in self._out.buffer or self._out.done, timeout):
            tail = bytes(self._out.buffer[-200:])
            raise TimeoutError(f"{want!r} did not appear within {timeout} s; the last output: {tail!r}")
        found = self._out.take_until(want)
        if found is not None:
            return found
        if self._out.failure is not None:
            raise self._out.failure
        raise self._out.ended(self.id)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while data := await self.read():
            yield data

    # --- the end

    async def wait(self, timeout: float | None = None) -> int:
        """See `Terminal.wait`."""
        if not await self._until(lambda: self._out.done, timeout):
            raise TimeoutError(f"terminal {self.id} still runs after {timeout} s")
        return self._out.result(self.id)

    async def detach(self) -> None:
        """See `Terminal.detach`."""
        if self._out.done:
            return
        self._out.detached = True
        self._call.cancel()
        task = self._task
        if task is None or task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except asyncio.TimeoutError:
            pass
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # the caller's own cancellation

    async def close(self) -> None:
        """See `Terminal.close`."""
        attached = not self._out.done
        await self._hang_up()
        if attached:
            await self._until(lambda: self._out.done, _CLOSE_WAIT)
            if self._out.exit_code is not None:
                await self._hang_up()  # it ended: this forgets it
        await self.detach()

    async def _hang_up(self) -> None:
        request = terminal_pb2.CloseTerminalRequest(sandbox_id=self._sandbox_id, terminal_id=self.id)
        try:
            await self._conn.terminals.CloseTerminal(request, metadata=self._conn.metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                await self.detach()
                raise from_rpc_error(e) from None

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        # As `Terminal.__exit__`: a terminal detached in the block runs on.
        if not self._out.detached:
            await self.close()


class AsyncTerminals:
    """See `mentis.Terminals`. `open` and `attach` are awaited or used in `async with`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    def open(
        self,
        command: builtins.list[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        env: dict[str, str] | None = None,
        cwd: str = "",
        idle_timeout: int = 0,
        on_output: Callable[[bytes], None] | None = None,
    ) -> _Pending[AsyncTerminal]:
        """See `Terminals.open`."""
        first = _start_request(self._sb.id, command, rows, cols, env, cwd, idle_timeout)
        return _Pending(lambda: self._track(first, on_output))

    def attach(
        self, terminal_id: str, *, after_seq: int = 0, on_output: Callable[[bytes], None] | None = None
    ) -> _Pending[AsyncTerminal]:
        """See `Terminals.attach`."""
        first = _attach_request(self._sb.id, terminal_id, after_seq)
        return _Pending(lambda: self._track(first, on_output))

    async def _track(
        self, first: terminal_pb2.OpenRequest, on_output: Callable[[bytes], None] | None
    ) -> AsyncTerminal:
        terminal = await AsyncTerminal(self._sb._conn, self._sb.id, on_output)._start(first)
        self._sb._open_terminals.add(terminal)
        return terminal

    async def list(self) -> builtins.list[TerminalInfo]:
        """See `Terminals.list`."""
        conn = self._sb._conn
        r = await conn.call(
            conn.terminals.ListTerminals, terminal_pb2.ListTerminalsRequest(sandbox_id=self._sb.id)
        )
        return [_terminal_info(t) for t in r.terminals]

    async def close(self, terminal_id: str) -> None:
        """See `Terminals.close`."""
        conn = self._sb._conn
        await conn.call(
            conn.terminals.CloseTerminal,
            terminal_pb2.CloseTerminalRequest(sandbox_id=self._sb.id, terminal_id=terminal_id),
        )

    async def link(self, terminal_id: str = "", *, ttl: int = 0) -> TerminalLink:
        """See `Terminals.link`."""
        conn = self._sb._conn
        r = await conn.call(
            conn.terminals.CreateTerminalLink,
            terminal_pb2.CreateTerminalLinkRequest(
                sandbox_id=self._sb.id, terminal_id=terminal_id, ttl_seconds=ttl
            ),
        )
        return _link(r)
