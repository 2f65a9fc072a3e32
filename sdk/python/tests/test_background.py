"""Commands in the background (`run(..., background=True)`, `attach_command`), with both APIs, against a real
runtime and real sandboxes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid

import pytest

import mentis
from mentis import AsyncSandbox, Sandbox


@pytest.fixture(scope="module")
def sb(runtime):
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        yield sandbox


def _until(ready, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _command_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mentis-command-")]


def test_a_background_command_returns_at_once_and_its_callbacks_see_its_output_in_order_as_it_comes(sb):
    go = f"go-order-{uuid.uuid4().hex[:8]}"
    events: list[tuple[str, str, threading.Thread]] = []
    h = sb.run(
        "echo out1; sleep 0.2; echo err1 >&2; sleep 0.2; echo out2; sleep 0.2; echo err2 >&2;"
        f" until [ -e {go} ]; do sleep 0.05; done; echo last; exit 7",
        background=True,
        on_stdout=lambda text: events.append(("out", text, threading.current_thread())),
        on_stderr=lambda text: events.append(("err", text, threading.current_thread())),
    )
    assert isinstance(h, mentis.CommandHandle) and h.action_id
    # The output comes while the command runs (it waits for the file below).
    _until(lambda: "".join(text for _, text, _ in events) == "out1\nerr1\nout2\nerr2\n")
    with pytest.raises(TimeoutError):
        h.wait(timeout=0.2)
    sb.files.write(go, "")
    r = h.wait(timeout=60)
    assert (r.exit_code, r.reason, r.ok, r.action_id) == (7, "exited", False, h.action_id)
    assert (r.stdout, r.stderr) == ("out1\nout2\nlast\n", "err1\nerr2\n")
    # In the order it was written, stdout and stderr interleaved, from the handle's own thread, now ended.
    assert "".join(text for _, text, _ in events) == "out1\nerr1\nout2\nerr2\nlast\n"
    assert [kind for kind, _, _ in events] == ["out", "err", "out", "err", "out"]
    assert {thread for _, _, thread in events} == {h._thread} and h._thread is not threading.current_thread()
    assert not h._thread.is_alive()
    assert h.wait() == r  # again: the same result


def test_kill_ends_a_background_command_as_cancelled(sb):
    started = threading.Event()
    h = sb.run("echo started; sleep 120; echo never", background=True, on_stdout=lambda _: started.set())
    assert started.wait(timeout=30)
    h.kill()
    r = h.wait(timeout=30)
    assert (r.reason, r.stdout) == ("cancelled", "started\n"), r
    assert r.duration < 60
    h.kill()  # it ended: no error
    assert not h._thread.is_alive()


def test_a_command_queued_behind_its_session_is_handed_back_at_once(sb):
    first = sb.run("sleep 60; echo first", session="bg", background=True)
    asked = time.monotonic()
    second = sb.run("echo second-$PWD", session="bg", background=True, cwd="/tmp")
    # The runtime accepted it; it has not started. (Waiting for its stream's first message would take until
    # the stream's first keepalive, 15 s.)
    assert time.monotonic() - asked < 10
    with pytest.raises(TimeoutError):
        second.wait(timeout=0.5)
    first.kill()  # a session command is interrupted, and the session kept for the next one
    assert first.wait(timeout=30).reason == "cancelled"
    assert second.wait(timeout=30).stdout == "second-/tmp\n"


def test_a_command_is_attached_again_by_its_action_id_from_another_sandbox_and_process(runtime, sb):
    go = f"go-attach-{uuid.uuid4().hex[:8]}"
    before = "".join(f"line{i}\n" for i in range(1, 11))
    expected = before + "".join(f"line{i}\n" for i in range(11, 21))
    h = sb.run(
        f"for i in $(seq 1 10); do echo line$i; done; until [ -e {go} ]; do sleep 0.05; done;"
        " for i in $(seq 11 20); do echo line$i; sleep 0.02; done; exit 3",
        background=True,
    )
    with Sandbox.connect(sb.id, addr=runtime.addr, api_key=runtime.key) as other:
        seen: list[str] = []
        again = other.attach_command(h.action_id, on_stdout=seen.append)
        # What it printed before the attach is replayed, then what follows comes live.
        _until(lambda: "".join(seen) == before)
        assert again._thread.is_alive()
        sb.files.write(go, "")
        theirs = again.wait(timeout=60)
    mine = h.wait(timeout=60)
    assert (mine.exit_code, mine.stdout) == (3, expected)
    assert theirs == mine and "".join(seen) == expected
    # After its end: its whole output and result at once.
    assert sb.attach_command(h.action_id).wait(timeout=30) == mine
    # From another process, knowing only the sandbox and the action id.
    script = (
        "import sys\n"
        "from mentis import Sandbox\n"
        "with Sandbox.connect(sys.argv[1], addr=sys.argv[3], api_key=sys.argv[4]) as sb:\n"
        "    r = sb.attach_command(sys.argv[2]).wait(timeout=60)\n"
        "    print(r.exit_code, r.stdout.split()[0], r.stdout.split()[-1])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, sb.id, h.action_id, runtime.addr, runtime.key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (out.returncode, out.stdout) == (0, "3 line1 line20\n"), out.stderr


def test_a_detached_command_runs_on_and_closing_the_connection_detaches_its_commands(runtime, sb):
    go = f"go-detach-{uuid.uuid4().hex[:8]}"
    h = sb.run(f"echo a; until [ -e {go} ]; do sleep 0.05; done; echo b", background=True)
    h.detach()
    assert not h._thread.is_alive()
    with pytest.raises(mentis.FailedPrecondition):
        h.wait(timeout=5)
    h.detach()  # twice: no error

    other = Sandbox.connect(sb.id, addr=runtime.addr, api_key=runtime.key)
    followed = other.attach_command(h.action_id)
    other.close()
    assert not followed._thread.is_alive()
    with pytest.raises(mentis.FailedPrecondition):
        followed.wait(timeout=5)

    sb.files.write(go, "")  # it ran on meanwhile
    r = sb.attach_command(h.action_id).wait(timeout=30)
    assert (r.exit_code, r.stdout) == (0, "a\nb\n")


def test_a_callbacks_error_is_raised_by_wait_and_the_command_runs_on(sb):
    def boom(text: str) -> None:
        raise RuntimeError(f"callback saw {text!r}")

    h = sb.run("echo x; sleep 1; echo y", background=True, on_stdout=boom)
    with pytest.raises(RuntimeError, match="callback saw 'x"):
        h.wait(timeout=30)
    assert not h._thread.is_alive()
    assert sb.attach_command(h.action_id).wait(timeout=30).stdout == "x\ny\n"


def test_a_network_drop_under_a_background_command_is_resumed_and_every_byte_arrives_once(runtime, proxy):
    with Sandbox.create(addr=proxy.addr, api_key=runtime.key) as sandbox:
        seen: list[str] = []

        def on_stdout(text: str) -> None:
            seen.append(text)
            if proxy.cuts == 0 and "10\n" in "".join(seen):
                proxy.cut()

        command = "for i in $(seq 1 60); do echo $i; sleep 0.03; done"
        h = sandbox.run(command, background=True, on_stdout=on_stdout)
        r = h.wait(timeout=60)
        expected = "".join(f"{i}\n" for i in range(1, 61))
        assert proxy.cuts == 1
        assert (r.exit_code, r.stdout, "".join(seen)) == (0, expected, expected)


def test_background_mistakes_are_typed_errors_raised_at_once(runtime, sb):
    with pytest.raises(mentis.InvalidArgument):
        sb.run("true", session="not a session name", background=True)
    with pytest.raises(mentis.NotFound) as missing:
        sb.attach_command(str(uuid.uuid4()))
    assert missing.value.reason == "ACTION_NOT_FOUND"
    with pytest.raises(mentis.InvalidArgument):
        sb.attach_command("")
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as gone:
        gone.delete()
        with pytest.raises(mentis.FailedPrecondition) as refused:
            gone.run("true", background=True)  # as run() without it refuses it
        assert refused.value.reason == "SANDBOX_ENDED", refused.value
    # No test of this module left a thread following a command.
    assert _command_threads() == []


def test_the_async_api_runs_commands_in_the_background(env):
    async def until(ready, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)

    async def main():
        async with AsyncSandbox.create() as sb:
            loop = asyncio.get_running_loop()
            events: list[str] = []
            on_loop: list[bool] = []

            def record(text: str) -> None:
                events.append(text)
                on_loop.append(asyncio.get_running_loop() is loop)

            h = await sb.run(
                "echo out1; sleep 0.2; echo err1 >&2; until [ -e go ]; do sleep 0.05; done;"
                " echo out2; exit 5",
                background=True,
                on_stdout=record,
                on_stderr=record,
            )
            assert isinstance(h, mentis.AsyncCommandHandle) and h.action_id
            await until(lambda: "".join(events) == "out1\nerr1\n")
            with pytest.raises(TimeoutError):
                await h.wait(timeout=0.2)

            other = await AsyncSandbox.connect(sb.id)
            try:
                seen: list[str] = []
                again = await other.attach_command(h.action_id, on_stdout=seen.append)
                await until(lambda: "".join(seen) == "out1\n")  # replayed
                await sb.files.write("go", "")
                mine, theirs = await h.wait(timeout=60), await again.wait(timeout=60)
            finally:
                await other.close()
            assert (mine.exit_code, mine.stdout, mine.stderr) == (5, "out1\nout2\n", "err1\n")
            assert theirs == mine and "".join(seen) == "out1\nout2\n"
            assert "".join(events) == "out1\nerr1\nout2\n" and all(on_loop)

            started = asyncio.Event()
            killed = await sb.run("echo s; sleep 120", background=True, on_stdout=lambda _: started.set())
            await asyncio.wait_for(started.wait(), 30)
            await killed.kill()
            assert (await killed.wait(timeout=30)).reason == "cancelled"

            detached = await sb.run("sleep 120", background=True)
            await detached.detach()
            assert detached._task.done()
            with pytest.raises(mentis.FailedPrecondition):
                await detached.wait(timeout=5)
            # Closing a connection detaches the commands it follows; the command runs on.
            other = await AsyncSandbox.connect(sb.id)
            followed = await other.attach_command(detached.action_id)
            await other.close()
            assert followed._task.done()
            await detached.kill()  # CancelAction needs no stream
            r = await (await sb.attach_command(detached.action_id)).wait(timeout=30)
            assert r.reason == "cancelled"

            with pytest.raises(mentis.InvalidArgument):
                await sb.run("true", session="not a session name", background=True)
            with pytest.raises(mentis.NotFound):
                await sb.attach_command(str(uuid.uuid4()))
            # No task of a handle runs on.
            assert [t for t in asyncio.all_tasks() if "_follow" in repr(t.get_coro())] == []

    asyncio.run(main())


def test_the_guides_background_example_runs_as_written(env, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "background")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "live: step 1",
        "live: step 2",
        "live: step 3",
        "4 exited",
        "cancelled",
    ]
