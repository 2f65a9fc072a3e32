"""The processes of a sandbox (ActionService.ListProcesses and SignalProcess; the synchronous API).

    for p in sb.processes.list():                  # as `ps` inside the sandbox would show them
        print(p.pid, p.user, p.command, p.role)     # role: "init", "executor", "ipython-kernel" or ""
    sb.processes.send_signal(pid, "INT")           # TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT, ...
    sb.processes.kill(pid)                         # SIGKILL

Signals go to one process, without a shell. A command started with `run` is better ended with its
`CommandHandle.kill()` (its whole process group); these are for what a command left running (`nohup ... &`,
a server) and for what an agent sees in `ps`.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import grpc

from .errors import InvalidArgument, from_rpc_error
from .terminal import _time
from .v1 import action_pb2

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = ["ProcessInfo", "Processes"]

# A pid is a positive int32 on the wire.
_MAX_PID = 2**31 - 1


@dataclass
class ProcessInfo:
    """One process of a sandbox when it was listed, as `ps` inside the sandbox would show it.

    `pid`, `ppid` and `pgid` are as the sandbox sees them (its own pid namespace; a shell command's processes
    are in the process group of the command's first process). `uid` is the effective user id and `user` its
    name in the sandbox (the number when it has none). `command` is its argv (empty for a zombie), `name`
    the kernel's short name (at most 15 bytes), `state` one letter as `ps` shows it (`R` running, `S`
    sleeping, `D` waiting on I/O, `T` stopped, `Z` zombie, ...). `cpu_seconds` is the CPU time used so far,
    `cpu_percent` the CPU used over its life in percent of one CPU (`ps`'s %CPU), `memory_bytes` its resident
    memory, `started_at` when it started.
    `role` says what it is to the sandbox: `"init"` (PID 1), `"executor"` (MentisSandbox's agent in it),
    `"ipython-kernel"` (the kernel of `run_code`), or `""` for everything else."""

    pid: int
    ppid: int
    pgid: int
    uid: int
    user: str
    command: list[str]
    name: str
    state: str
    cpu_seconds: float
    cpu_percent: float
    memory_bytes: int
    started_at: datetime | None
    role: str = ""


def _process_info(p: action_pb2.ProcessInfo) -> ProcessInfo:
    return ProcessInfo(
        pid=p.pid,
        ppid=p.ppid,
        pgid=p.pgid,
        uid=p.uid,
        user=p.user,
        command=list(p.command),
        name=p.name,
        state=p.state,
        cpu_seconds=p.cpu_seconds,
        cpu_percent=p.cpu_percent,
        memory_bytes=p.memory_bytes,
        started_at=_time(p.start_time),
        role=p.role,
    )


def _process_signal_request(sandbox_id: str, pid: Any, signal: Any) -> action_pb2.SignalProcessRequest:
    """SignalProcess's request. A pid that is no int, or does not fit a pid's 32 bits, and a signal that is
    not a str are InvalidArgument here; the runtime judges the rest (a pid of 0 or less, the signal's
    name)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise InvalidArgument(f"pid must be an int, not {type(pid).__name__}", field="pid")
    if not -_MAX_PID <= pid <= _MAX_PID:
        raise InvalidArgument(f"pid {pid} names no process", field="pid")
    if not isinstance(signal, str):
        raise InvalidArgument(f'signal is a name such as "TERM", not {signal!r}', field="signal")
    return action_pb2.SignalProcessRequest(sandbox_id=sandbox_id, pid=pid, signal=signal)


class Processes:
    """The sandbox's processes: `list` them, `send_signal` to one, `kill` one."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def list(self) -> builtins.list[ProcessInfo]:
        """Every process of the sandbox at the moment of the call, by pid, PID 1 and the executor included
        (tell them by `role`)."""
        conn = self._sb._conn
        request = action_pb2.ListProcessesRequest(sandbox_id=self._sb.id)
        return [_process_info(p) for p in _call(conn.actions.ListProcesses, request).processes]

    def send_signal(self, pid: int, signal: str) -> None:
        """Sends `signal` to process `pid` of the sandbox: `"TERM"`, `"KILL"`, `"INT"`, `"HUP"`, `"QUIT"`,
        `"USR1"`, `"USR2"`, `"STOP"`, `"CONT"`, `"TSTP"` or `"WINCH"` (any case, with or without SIG; another
        name is InvalidArgument, field `signal`). A pid the sandbox does not have is NotFound (reason
        `PROCESS_NOT_FOUND`); PID 1 and the executor are FailedPrecondition (delete or pause the sandbox
        instead)."""
        _call(self._sb._conn.actions.SignalProcess, _process_signal_request(self._sb.id, pid, signal))

    def kill(self, pid: int) -> None:
        """Kills process `pid` of the sandbox (SIGKILL: it cannot be caught), as `send_signal(pid, "KILL")`.
        It leaves `list()` once its parent has reaped it (until then it shows with state `Z`); a process
        whose parent ended is reaped by the sandbox's init at once."""
        self.send_signal(pid, "KILL")


def _call(method, request):
    try:
        return method(request)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
