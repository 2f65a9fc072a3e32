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
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Generator
from typing import Any, Callable, Generic, TypeVar

import grpc
import grpc.aio

from ._client import _MAX_MESSAGE, Settings
from .errors import AlreadyExists, Cancelled, MentisError, NotFound, from_rpc_error
from .sandbox import (
    _CHUNK,
    _RESUMABLE,
    _RESUME_FOR,
    CellResult,
    CommandResult,
    FileInfo,
    _cell_action,
    _CellCollector,
    _CommandCollector,
    _enum_name,
    _file_info,
    _shell_action,
    _spec,
)
from .v1 import (
    action_pb2,
    action_pb2_grpc,
    file_pb2,
    file_pb2_grpc,
    observation_pb2,
    sandbox_pb2,
    sandbox_pb2_grpc,
)

__all__ = ["AsyncFiles", "AsyncSandbox"]

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
    conn: _AsyncConnection, sandbox_id: str, action: action_pb2.Action, action_id: str
) -> AsyncIterator[observation_pb2.Observation]:
    """One action's observations, each once, across dropped streams (see `sandbox._ActionStream`)."""
    last_seq = 0
    started = False
    deadline: float | None = None
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
            # grpc.aio cancels the calls of a channel that was closed under them. Our own task being cancelled
            # goes on as it should (before Python 3.11 the two cannot be told apart: it always does).
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
        keep: bool = False,
        addr: str | None = None,
        api_key: str | None = None,
        tls: bool | None = None,
    ) -> _Pending[AsyncSandbox]:
        """Creates a sandbox: `await` it, or `async with` it (deleted at the end unless `keep=True`)."""

        async def make() -> AsyncSandbox:
            conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))
            spec = _spec(
                space,
                key,
                image=image,
                env=env,
                labels=labels,
                cpu=cpu,
                memory_mb=memory_mb,
                idle_timeout=idle_timeout,
            )
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
        conn = _AsyncConnection(Settings.resolve(addr, api_key, tls=tls))
        request = sandbox_pb2.GetSandboxByKeyRequest(space_id=space, external_key=key)
        for _ in range(3):
            try:
                r = await conn.call(conn.sandboxes.GetSandboxByKey, request)
                return cls(conn, r.sandbox, owned=False)
            except NotFound:
                pass
            spec = _spec(space, key, **create_args)
            try:
                r = await conn.call(conn.sandboxes.CreateSandbox, sandbox_pb2.CreateSandboxRequest(spec=spec))
                return cls(conn, r.sandbox, owned=False)
            except AlreadyExists:
                continue
        await conn.close()
        raise MentisError(f"no sandbox with key {key!r} could be found or created")

    @property
    def id(self) -> str:
        return self._info.sandbox_id

    @property
    def state(self) -> str:
        return _enum_name(sandbox_pb2.SandboxState, self._info.state, "SANDBOX_STATE_")

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

    async def delete(self) -> None:
        with contextlib.suppress(NotFound):
            await self._conn.call(
                self._conn.sandboxes.DeleteSandbox, sandbox_pb2.DeleteSandboxRequest(sandbox_id=self.id)
            )

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            if self._owned and not self._keep:
                await self.delete()
        finally:
            await self.close()

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
    ) -> CommandResult:
        """See `Sandbox.run`."""
        action = _shell_action(command, timeout, env, cwd, session, stdin)
        action_id = str(uuid.uuid4())
        collect = _CommandCollector(on_stdout, on_stderr)
        async for obs in _observations(self._conn, self.id, action, action_id):
            collect.feed(obs)
        return collect.result(action_id)

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
