"""Interactive terminals in a sandbox (TerminalService; the synchronous API).

    with sb.terminals.open(rows=24, cols=80) as term:     # a login bash on a real pseudo-terminal
        term.write("echo hi\\n")
        term.read_until("hi")
        term.resize(rows=40, cols=120)
        term.write("exit 3\\n")
        print(term.wait())                                  # 3

A terminal lives in the sandbox, not in the stream: `detach()` leaves it running and `sb.terminals.attach(id)`
comes back to it (its scrollback replayed); `close()` (and the end of a `with` block, unless it was detached
in the block) hangs it up. A stream that drops is attached again after the last output received, so each
byte arrives once.
"""

from __future__ import annotations

import builtins
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import grpc

from .errors import FailedPrecondition, InvalidArgument, MentisError, NotFound, from_rpc_error
from .v1 import terminal_pb2

if TYPE_CHECKING:
    from ._client import Connection
    from .sandbox import Sandbox

__all__ = ["Terminal", "TerminalInfo", "TerminalLink", "Terminals"]

# As sandbox.py's: statuses after which a stream is attached again, and for how long.
_RESUMABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
_RESUME_FOR = 60.0
# Bytes of input per message.
_INPUT_CHUNK = 64 * 1024
# The largest width or height a terminal takes (the runtime's bound).
_MAX_SIZE = 1000
# Signals a terminal takes, as `kill -l` names them without SIG.
_SIGNALS = ("INT", "TERM", "KILL", "HUP", "QUIT", "TSTP", "CONT", "USR1", "USR2", "WINCH")
# How long `close` waits for the program to end after the hang-up (SIGHUP, then SIGKILL a second later).
_CLOSE_WAIT = 10.0


@dataclass
class TerminalInfo:
    """A terminal of the sandbox, as `Terminals.list` reports it. `exit_code` is None while it runs."""

    id: str
    command: list[str]
    cols: int
    rows: int
    pid: int
    created_at: datetime | None
    last_seq: int
    attached: int
    exit_code: int | None


@dataclass
class TerminalLink:
    """A link to the runtime's web terminal: `path` (`/terminal#token=...`) goes after the runtime's HTTP
    address; it can be opened until `expires_at`."""

    token: str
    path: str
    expires_at: datetime | None


# --- checks and messages shared with the asyncio API


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _size(rows: int, cols: int, *, zero_ok: bool) -> tuple[int, int]:
    for name, n in (("rows", rows), ("cols", cols)):
        if not isinstance(n, int) or isinstance(n, bool):
            raise InvalidArgument(f"{name} must be an int, not {type(n).__name__}", field=name)
        low = 0 if zero_ok else 1
        if not low <= n <= _MAX_SIZE:
            raise InvalidArgument(f"{name} is {n}; it must be {low} to {_MAX_SIZE}", field=name)
    return rows, cols


def _signal_name(name: str) -> str:
    bare = name.upper().removeprefix("SIG")
    if bare not in _SIGNALS:
        raise InvalidArgument(f"unknown signal {name!r}; one of {', '.join(_SIGNALS)}", field="signal")
    return bare


def _start_request(
    sandbox_id: str,
    command: builtins.list[str] | None,
    rows: int,
    cols: int,
    env: dict[str, str] | None,
    cwd: str,
    idle_timeout: int,
) -> terminal_pb2.OpenRequest:
    if isinstance(command, str):
        raise InvalidArgument(
            "command is a list of arguments (argv, no shell), not a string", field="command"
        )
    rows, cols = _size(rows, cols, zero_ok=True)
    return terminal_pb2.OpenRequest(
        start=terminal_pb2.OpenRequest.Start(
            sandbox_id=sandbox_id,
            command=list(command or []),
            rows=rows,
            cols=cols,
            env=env or {},
            work_dir=cwd,
            idle_timeout_seconds=idle_timeout,
        )
    )


def _attach_request(sandbox_id: str, terminal_id: str, after_seq: int) -> terminal_pb2.OpenRequest:
    return terminal_pb2.OpenRequest(
        attach=terminal_pb2.OpenRequest.Attach(
            sandbox_id=sandbox_id, terminal_id=terminal_id, after_seq=after_seq
        )
    )


def _input_requests(data: bytes | str) -> builtins.list[terminal_pb2.OpenRequest]:
    blob = _as_bytes(data)
    return [
        terminal_pb2.OpenRequest(input=terminal_pb2.OpenRequest.Input(data=blob[i : i + _INPUT_CHUNK]))
        for i in range(0, len(blob), _INPUT_CHUNK)
    ]


def _resize_request(rows: int, cols: int) -> terminal_pb2.OpenRequest:
    return terminal_pb2.OpenRequest(resize=terminal_pb2.OpenRequest.Resize(rows=rows, cols=cols))


def _signal_request(name: str) -> terminal_pb2.OpenRequest:
    return terminal_pb2.OpenRequest(signal=terminal_pb2.OpenRequest.Signal(name=_signal_name(name)))


def _time(ts) -> datetime | None:
    return ts.ToDatetime(tzinfo=timezone.utc) if ts.seconds or ts.nanos else None


def _terminal_info(t: terminal_pb2.TerminalInfo) -> TerminalInfo:
    return TerminalInfo(
        id=t.terminal_id,
        command=list(t.command),
        cols=t.cols,
        rows=t.rows,
        pid=t.pid,
        created_at=_time(t.created_at),
        last_seq=t.last_seq,
        attached=t.attached,
        exit_code=t.exit_code if t.HasField("exit_code") else None,
    )


def _link(r: terminal_pb2.CreateTerminalLinkResponse) -> TerminalLink:
    return TerminalLink(token=r.token, path=r.path, expires_at=_time(r.expires_at))


class _Output:
    """What a terminal printed and how it ended, shared by the thread (or task) that reads its stream and
    the caller. Output goes to the callback when there is one, else into a buffer that `read` empties."""

    def __init__(self, on_output: Callable[[bytes], None] | None) -> None:
        self.on_output = on_output
        self.buffer = bytearray()
        self.last_seq = 0
        self.exit_code: int | None = None
        self.signal = 0
        self.failure: BaseException | None = None
        self.detached = False
        self.done = False

    def feed(self, output: terminal_pb2.OpenResponse.Output) -> bytes:
        """Takes one output message; the bytes new to this client (a replay after a reattach repeats some)."""
        if output.seq <= self.last_seq:
            return b""
        self.last_seq = output.seq
        if self.on_output is None:
            self.buffer += output.data
        return output.data

    def take(self) -> bytes:
        data = bytes(self.buffer)
        self.buffer.clear()
        return data

    def take_until(self, marker: bytes) -> bytes | None:
        i = self.buffer.find(marker)
        if i < 0:
            return None
        end = i + len(marker)
        data = bytes(self.buffer[:end])
        del self.buffer[:end]
        return data

    def check_readable(self) -> None:
        if self.on_output is not None:
            raise MentisError(
                "this terminal's output goes to its on_output callback; there is nothing to read"
            )

    def check_open(self, terminal_id: str) -> None:
        if self.failure is not None:
            raise self.failure
        if self.exit_code is not None:
            raise FailedPrecondition(f"terminal {terminal_id} has exited (exit code {self.exit_code})")
        if self.done:
            raise FailedPrecondition(f"terminal {terminal_id} is no longer attached")

    def ended(self, terminal_id: str) -> EOFError:
        if self.exit_code is not None:
            return EOFError(f"terminal {terminal_id} exited (exit code {self.exit_code})")
        return EOFError(f"terminal {terminal_id} is no longer attached")

    def result(self, terminal_id: str) -> int:
        if self.exit_code is not None:
            return self.exit_code
        if self.failure is not None:
            raise self.failure
        raise FailedPrecondition(f"terminal {terminal_id} was detached before its program ended")


def _until_none(requests: queue.Queue) -> Iterator[terminal_pb2.OpenRequest]:
    """A stream's requests, as they are put in; None ends them (the client's side of the stream closes)."""
    while True:
        item = requests.get()
        if item is None:
            return
        yield item


class Terminal:
    """An interactive terminal in a sandbox: a program on a real pseudo-terminal. Made by
    `sb.terminals.open(...)` or `sb.terminals.attach(terminal_id)`.

    Input: `write` (bytes or str; "\\r" or "\\n" is Enter, "\\x03" is Ctrl-C), `resize`, `send_signal`.
    Output, as the program wrote it (escape sequences included): `read`, `read_until`, iteration (chunks of
    bytes until the program ends), or the `on_output` callback (called from a thread of the SDK; then nothing
    is kept for `read`). `wait` returns the exit code. Used in a `with` block, the terminal is closed at its
    end, unless it was detached in the block (then it runs on, for `sb.terminals.attach`).
    """

    def __init__(
        self,
        conn: Connection,
        sandbox_id: str,
        first: terminal_pb2.OpenRequest,
        on_output: Callable[[bytes], None] | None = None,
    ) -> None:
        self._conn = conn
        self._sandbox_id = sandbox_id
        self._out = _Output(on_output)
        self._cond = threading.Condition()
        self._requests: queue.Queue = queue.Queue()
        self._call: Any = None
        started = self._open_stream(first)
        self.id: str = started.terminal_id
        self._rows, self._cols = started.rows, started.cols
        self._reader = threading.Thread(
            target=self._read_stream, name=f"mentis-terminal-{self.id}", daemon=True
        )
        self._reader.start()

    # --- the stream

    def _open_stream(self, first: terminal_pb2.OpenRequest) -> terminal_pb2.OpenResponse.Started:
        """Opens a stream with `first` (start or attach) and returns its `started`; typed errors."""
        requests: queue.Queue = queue.Queue()
        requests.put(first)
        call = self._conn.terminals.Open(_until_none(requests))
        try:
            for response in call:
                if response.HasField("started"):
                    break
            else:
                raise MentisError("the terminal's stream ended before it started")
        except grpc.RpcError as e:
            requests.put(None)
            raise from_rpc_error(e) from None
        except BaseException:
            requests.put(None)
            call.cancel()
            raise
        with self._cond:
            # Input written while the stream was down goes on the new one.
            old = self._requests
            with contextlib.suppress(queue.Empty):
                while True:
                    item = old.get_nowait()
                    if item is not None:
                        requests.put(item)
            old.put(None)
            self._requests, self._call = requests, call
        return response.started

    def _read_stream(self) -> None:
        """The reading thread: output into the buffer or the callback, until `exited`, a detach or a failure;
        a stream that drops is attached again after the last output received."""
        deadline: float | None = None
        while True:
            generation = self._conn.generation
            failure: MentisError
            try:
                if self._follow():
                    return
                failure = MentisError(f"terminal {self.id}'s stream ended before its program")
            except grpc.RpcError as e:
                if self._out.detached:
                    self._end()
                    return
                if e.code() not in _RESUMABLE:
                    self._end(failure=from_rpc_error(e))
                    return
                failure = from_rpc_error(e)
                self._conn.reconnect(generation)
            except Exception as e:  # the callback's or a listing's error: the terminal's failure
                self._call.cancel()
                self._end(failure=e)
                return
            with self._cond:
                # Input written from now on waits here for the next stream (the old one's is gone).
                old, self._requests = self._requests, queue.Queue()
                old.put(None)
            # Attach again, after the last output received, within the deadline.
            while True:
                now = time.monotonic()
                deadline = deadline or now + _RESUME_FOR
                if self._out.detached:
                    self._end()
                    return
                if now > deadline:
                    self._end(failure=failure)
                    return
                time.sleep(0.05)
                try:
                    started = self._open_stream(
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
                    self._requests.put(_resize_request(self._rows, self._cols))
                deadline = None
                break

    def _follow(self) -> bool:
        """Follows the current stream; True once the terminal's end (or this client's) is recorded."""
        for response in self._call:
            kind = response.WhichOneof("kind")
            if kind == "output":
                with self._cond:
                    data = self._out.feed(response.output)
                    self._cond.notify_all()
                if data and self._out.on_output is not None:
                    self._out.on_output(data)
            elif kind == "exited":
                self._end(exit_code=response.exited.exit_code, signal=response.exited.signal)
                return True
        if self._out.detached:
            self._end()
            return True
        # Ended without `exited`: the program may have ended all the same, or a proxy cut the stream.
        known = self._exit_from_list()
        if known is not None:
            self._end(exit_code=known)
            return True
        return False

    def _exit_from_list(self) -> int | None:
        """The exit code ListTerminals reports for this terminal (None while it runs); as `mentis shell`."""
        request = terminal_pb2.ListTerminalsRequest(sandbox_id=self._sandbox_id)
        try:
            listed = self._conn.terminals.ListTerminals(request).terminals
        except grpc.RpcError as e:
            if e.code() in _RESUMABLE:
                return None
            raise from_rpc_error(e) from None
        for t in listed:
            if t.terminal_id == self.id:
                return t.exit_code if t.HasField("exit_code") else None
        raise NotFound(f"terminal {self.id} is gone", reason="TERMINAL_NOT_FOUND")

    def _end(
        self, *, exit_code: int | None = None, signal: int = 0, failure: BaseException | None = None
    ) -> None:
        with self._cond:
            if exit_code is not None:
                self._out.exit_code, self._out.signal = exit_code, signal
            self._out.failure = failure
            self._out.done = True
            self._requests.put(None)
            self._cond.notify_all()

    def _send(self, *requests: terminal_pb2.OpenRequest) -> None:
        with self._cond:
            self._out.check_open(self.id)
            for r in requests:
                self._requests.put(r)

    # --- what it is

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self._cols

    @property
    def exit_code(self) -> int | None:
        """The program's exit code (128 + N when signal N killed it); None while it runs."""
        return self._out.exit_code

    @property
    def signal(self) -> int:
        """The signal that killed the program; 0 when it exited (or runs)."""
        return self._out.signal

    @property
    def last_seq(self) -> int:
        """The seq of the newest output received (`attach(after_seq=...)` replays what follows it)."""
        return self._out.last_seq

    def __repr__(self) -> str:
        return f"Terminal({self.id!r}, exit_code={self.exit_code!r})"

    # --- input

    def write(self, data: bytes | str) -> None:
        """Types `data` into the terminal (str is sent as UTF-8); FailedPrecondition once it ended."""
        self._send(*_input_requests(data))

    def resize(self, rows: int, cols: int) -> None:
        """Gives the terminal a new size (1 to 1000 each); the program gets SIGWINCH."""
        rows, cols = _size(rows, cols, zero_ok=False)
        self._send(_resize_request(rows, cols))
        self._rows, self._cols = rows, cols

    def send_signal(self, name: str) -> None:
        """Sends a signal to the terminal's foreground process group: `"INT"`, `"TERM"`, `"KILL"`, `"HUP"`,
        `"QUIT"`, `"TSTP"`, `"CONT"`, `"USR1"`, `"USR2"` or `"WINCH"` (with or without SIG)."""
        self._send(_signal_request(name))

    # --- output

    def read(self, timeout: float | None = None) -> bytes:
        """The output that arrived since the last read, waiting up to `timeout` seconds (None: no limit) for
        some. b"" when the time passed with none, or once the terminal ended and everything was read."""
        with self._cond:
            self._out.check_readable()
            self._cond.wait_for(lambda: self._out.buffer or self._out.done, timeout)
            if self._out.buffer:
                return self._out.take()
            if self._out.done and self._out.failure is not None:
                raise self._out.failure
            return b""

    def read_until(self, marker: bytes | str, timeout: float | None = 30.0) -> bytes:
        """Reads until `marker` appears and returns the output up to and including it (what follows stays to
        be read). TimeoutError when it did not appear within `timeout` seconds, EOFError when the terminal
        ended first."""
        want = _as_bytes(marker)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._out.check_readable()
            while True:
                found = self._out.take_until(want)
                if found is not None:
                    return found
                if self._out.done:
                    if self._out.failure is not None:
                        raise self._out.failure
                    raise self._out.ended(self.id)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    tail = bytes(self._out.buffer[-200:])
                    raise TimeoutError(
                        f"{want!r} did not appear within {timeout} s; the last output: {tail!r}"
                    )
                self._cond.wait(left)

    def __iter__(self) -> Iterator[bytes]:
        """The output in chunks as it arrives, until the program ends."""
        while data := self.read():
            yield data

    # --- the end

    def wait(self, timeout: float | None = None) -> int:
        """Waits for the program to end and returns its exit code (128 + N when signal N killed it).
        TimeoutError when it runs on after `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._out.done, timeout):
                raise TimeoutError(f"terminal {self.id} still runs after {timeout} s")
            return self._out.result(self.id)

    def detach(self) -> None:
        """Ends this client's stream and leaves the terminal running in the sandbox (until its idle timeout):
        `sb.terminals.attach(terminal.id)` comes back to it."""
        with self._cond:
            if self._out.done:
                return
            self._out.detached = True
            self._requests.put(None)
            call = self._call
        call.cancel()
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=10)

    def close(self) -> None:
        """Hangs the terminal up (its session gets SIGHUP, then SIGKILL a second later), waits for the
        program's end and has the sandbox forget it. Closing twice, or a terminal that ended, is no error."""
        attached = not self._out.done
        self._hang_up()
        if attached:
            with self._cond:
                self._cond.wait_for(lambda: self._out.done, _CLOSE_WAIT)
            if self._out.exit_code is not None:
                self._hang_up()  # it ended: this forgets it
        self.detach()

    def _hang_up(self) -> None:
        request = terminal_pb2.CloseTerminalRequest(sandbox_id=self._sandbox_id, terminal_id=self.id)
        try:
            self._conn.terminals.CloseTerminal(request)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                self.detach()
                raise from_rpc_error(e) from None

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: Any) -> None:
        # A terminal detached in the block runs on in the sandbox, as `detach` says; others are closed.
        if not self._out.detached:
            self.close()


class Terminals:
    """The sandbox's terminals: `open` one, `attach` to one, `list`, `close`, `link` (the web terminal)."""

    def __init__(self, sandbox: Sandbox) -> None:
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
    ) -> Terminal:
        """Starts `command` (argv, no shell; None: a login bash) on a new terminal of `rows` x `cols` (at most
        1000 each), with `env` over the sandbox's (TERM is xterm-256color) in `cwd` (default /workspace).
        `idle_timeout`: seconds the terminal outlives its last client (0: the runtime's default, 15 minutes).
        `on_output` gets its output as it arrives (then `read` has none)."""
        first = _start_request(self._sb.id, command, rows, cols, env, cwd, idle_timeout)
        return self._track(Terminal(self._sb._conn, self._sb.id, first, on_output))

    def attach(
        self, terminal_id: str, *, after_seq: int = 0, on_output: Callable[[bytes], None] | None = None
    ) -> Terminal:
        """A terminal of the sandbox that still runs (or ended and is not yet forgotten): its scrollback after
        `after_seq` (0: all that is kept) is replayed, then its output followed."""
        first = _attach_request(self._sb.id, terminal_id, after_seq)
        return self._track(Terminal(self._sb._conn, self._sb.id, first, on_output))

    def _track(self, terminal: Terminal) -> Terminal:
        self._sb._open_terminals.add(terminal)
        return terminal

    def list(self) -> builtins.list[TerminalInfo]:
        """The sandbox's terminals, oldest first: running, or ended and not yet forgotten."""
        conn = self._sb._conn
        r = _call(conn.terminals.ListTerminals, terminal_pb2.ListTerminalsRequest(sandbox_id=self._sb.id))
        return [_terminal_info(t) for t in r.terminals]

    def close(self, terminal_id: str) -> None:
        """Hangs up a terminal by id (SIGHUP, then SIGKILL); one that already ended is forgotten."""
        conn = self._sb._conn
        _call(
            conn.terminals.CloseTerminal,
            terminal_pb2.CloseTerminalRequest(sandbox_id=self._sb.id, terminal_id=terminal_id),
        )

    def link(self, terminal_id: str = "", *, ttl: int = 0) -> TerminalLink:
        """A link to the runtime's web terminal for this sandbox, attached to `terminal_id` (empty: the page
        starts a login bash), that opens, and whose page stays open, for `ttl` seconds (0: an hour; at most 12
        hours).
        FailedPrecondition when the runtime serves no web page (MENTIS_HTTP_LISTEN unset)."""
        conn = self._sb._conn
        r = _call(
            conn.terminals.CreateTerminalLink,
            terminal_pb2.CreateTerminalLinkRequest(
                sandbox_id=self._sb.id, terminal_id=terminal_id, ttl_seconds=ttl
            ),
        )
        return _link(r)


def _call(method, request):
    try:
        return method(request)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
