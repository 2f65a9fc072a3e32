"""A sandbox's processes (`sb.processes`: list, send_signal, kill), with both APIs, against a real runtime and
real sandboxes."""

from __future__ import annotations

import asyncio
import datetime
import shlex
import time

import pytest

import mentis
from mentis import AsyncSandbox, Sandbox


@pytest.fixture(scope="module")
def sb(runtime):
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        yield sandbox


def _start(sb: Sandbox, command: str) -> int:
    """Starts `command` in the background of the sandbox, left running after the shell ends, and returns its
    pid once it runs the program (a moment after `$!` is known, its argv is the shell's, then nohup's)."""
    r = sb.run(f"nohup {command} >/dev/null 2>&1 & echo $!")
    assert r.ok, r
    pid, argv = int(r.stdout), shlex.split(command)
    deadline = time.monotonic() + 10
    while (listed := _by_pid(sb.processes.list()).get(pid)) is None or listed.command != argv:
        assert time.monotonic() < deadline, f"{command} did not start: {listed}"
        time.sleep(0.02)
    return pid


def _by_pid(processes: list[mentis.ProcessInfo]) -> dict[int, mentis.ProcessInfo]:
    return {p.pid: p for p in processes}


def _gone_soon(sb: Sandbox, pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if pid not in _by_pid(sb.processes.list()):
            return True
        time.sleep(0.05)
    return False


def test_the_list_shows_a_background_process_with_its_argv_user_and_times_and_the_sandboxs_own_by_role(sb):
    before = datetime.datetime.now(datetime.timezone.utc)
    pid = _start(sb, "sleep 3171")
    after = datetime.datetime.now(datetime.timezone.utc)
    assert sb.run_code("6 * 7").ok  # the kernel runs
    listed = sb.processes.list()
    assert [p.pid for p in listed] == sorted(p.pid for p in listed)  # by pid
    assert all(isinstance(p, mentis.ProcessInfo) for p in listed)
    sleeper = _by_pid(listed)[pid]
    uid = int(sb.run("id -u").stdout)
    assert (sleeper.command, sleeper.name) == (["sleep", "3171"], "sleep")
    assert (sleeper.user, sleeper.uid) == ("sandbox", uid)
    assert (sleeper.ppid, sleeper.state, sleeper.role) == (1, "S", "")  # its shell ended: init adopted it
    assert sleeper.pgid > 1 and sleeper.memory_bytes > 0 and sleeper.cpu_seconds >= 0
    # The runtime counts a start from the boot time, which the kernel gives in whole seconds.
    slack = datetime.timedelta(seconds=2)
    assert before - slack <= sleeper.started_at <= after + slack, (before, sleeper.started_at, after)
    # As `ps` in the sandbox sees it.
    ps = sb.run(f"ps -o pid=,ppid=,pgid=,user=,s=,args= -p {pid}").stdout.split()
    assert ps[:5] == [str(pid), "1", str(sleeper.pgid), "sandbox", "S"] and ps[5:] == sleeper.command

    roles = {p.role: p for p in listed if p.role}
    assert set(roles) == {"init", "executor", "ipython-kernel"}
    assert (roles["init"].pid, roles["init"].user) == (1, "root")
    assert roles["executor"].command[0].endswith("mentis-executor")
    assert "ipykernel_launcher" in roles["ipython-kernel"].command
    assert len([p for p in listed if p.role == "executor"]) == 1
    sb.processes.kill(pid)


def test_signals_reach_one_process_by_name_and_kill_ends_it(sb):
    # A process that traps TERM says so; STOP and CONT stop it and let it go on.
    script = 'trap "echo trapped > term.txt; exit 0" TERM; touch ready; while :; do sleep 0.1; done'
    pid = _start(sb, f"bash -c '{script}'")
    _file_soon(sb, "ready")
    sb.processes.send_signal(pid, "STOP")
    assert _state_soon(sb, pid, "T")
    sb.processes.send_signal(pid, "cont")  # any case
    assert _state_soon(sb, pid, "S")
    sb.processes.send_signal(pid, "SIGTERM")  # with SIG
    assert _gone_soon(sb, pid)
    assert sb.files.read_text("term.txt") == "trapped\n"

    # KILL cannot be trapped.
    pid = _start(sb, "bash -c 'trap \"\" TERM INT HUP; touch ignoring; while :; do sleep 0.1; done'")
    _file_soon(sb, "ignoring")
    sb.processes.send_signal(pid, "TERM")
    sb.processes.send_signal(pid, "INT")
    time.sleep(0.3)
    assert _by_pid(sb.processes.list())[pid].state in ("S", "R")  # ignored
    sb.processes.kill(pid)
    assert _gone_soon(sb, pid)


def _file_soon(sb: Sandbox, path: str) -> None:
    deadline = time.monotonic() + 10
    while not sb.run(f"test -e {path}").ok:
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def _state_soon(sb: Sandbox, pid: int, state: str) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _by_pid(sb.processes.list())[pid].state == state:
            return True
        time.sleep(0.05)
    return False


def test_signal_mistakes_are_typed_errors_and_the_sandboxs_own_processes_are_refused(sb):
    listed = sb.processes.list()
    executor = next(p.pid for p in listed if p.role == "executor")
    for pid in (1, executor):
        with pytest.raises(mentis.FailedPrecondition):
            sb.processes.kill(pid)
        with pytest.raises(mentis.FailedPrecondition):
            sb.processes.send_signal(pid, "TERM")
    assert {1, executor} <= set(_by_pid(sb.processes.list()))  # still there
    assert sb.run("echo alive").stdout == "alive\n"

    unknown = 4_000_000  # above any pid the sandbox has made
    assert unknown not in _by_pid(listed)
    with pytest.raises(mentis.NotFound) as missing:
        sb.processes.kill(unknown)
    assert missing.value.reason == "PROCESS_NOT_FOUND"
    for pid in (0, -5):
        with pytest.raises(mentis.InvalidArgument) as bad:
            sb.processes.kill(pid)
        assert bad.value.field == "pid"
    pid = _start(sb, "sleep 600")
    with pytest.raises(mentis.InvalidArgument) as bad:
        sb.processes.send_signal(pid, "NOPE")
    assert bad.value.field == "signal"
    # Refused here, before any call.
    for wrong in ("12", 1.0, True, 2**31):
        with pytest.raises(mentis.InvalidArgument) as bad:
            sb.processes.kill(wrong)  # type: ignore[arg-type]
        assert bad.value.field == "pid"
    with pytest.raises(mentis.InvalidArgument) as bad:
        sb.processes.send_signal(pid, 9)  # type: ignore[arg-type]
    assert bad.value.field == "signal"
    assert pid in _by_pid(sb.processes.list())  # none of that reached it
    sb.processes.kill(pid)
    assert _gone_soon(sb, pid)


def test_the_async_api_lists_signals_and_kills_processes(env):
    async def main():
        async with AsyncSandbox.create() as sb:
            r = await sb.run("nohup sleep 2718 >/dev/null 2>&1 & echo $!")
            pid = int(r.stdout)
            for _ in range(500):  # until it runs sleep (before, its argv is the shell's, then nohup's)
                listed = {p.pid: p for p in await sb.processes.list()}
                if listed[pid].command[0] == "sleep":
                    break
                await asyncio.sleep(0.02)
            assert (listed[pid].command, listed[pid].user) == (["sleep", "2718"], "sandbox")
            assert listed[pid].role == "" and listed[pid].started_at is not None
            assert listed[1].role == "init"
            await sb.processes.send_signal(pid, "STOP")
            for _ in range(200):
                if {p.pid: p for p in await sb.processes.list()}[pid].state == "T":
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the process did not stop")
            await sb.processes.kill(pid)  # a stopped process is killed all the same
            for _ in range(200):
                if pid not in {p.pid for p in await sb.processes.list()}:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the killed process stayed")
            with pytest.raises(mentis.FailedPrecondition):
                await sb.processes.kill(1)
            with pytest.raises(mentis.NotFound) as missing:
                await sb.processes.send_signal(pid, "TERM")
            assert missing.value.reason == "PROCESS_NOT_FOUND"
            with pytest.raises(mentis.InvalidArgument):
                await sb.processes.kill(0)

    asyncio.run(main())


def test_the_guides_processes_example_runs_as_written(env, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "processes")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "sandbox ['python3', '-m', 'http.server', '8000']",
        "FAILED_PRECONDITION",
    ]
