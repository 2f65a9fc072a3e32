"""Watching a directory of the workspace (`sb.files.watch`, `attach_watch`), with both APIs, against a real
runtime and real sandboxes."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import threading
import time

import pytest

import mentis
from mentis import AsyncSandbox, Sandbox


@pytest.fixture(scope="module")
def sb(runtime):
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        yield sandbox


def _until(watch: mentis.FileWatch, kind: str, path: str, timeout: float = 30) -> list[mentis.FileEvent]:
    """The events `watch` gives until one of `kind` at `path` (that one included)."""
    got: list[mentis.FileEvent] = []
    deadline = time.monotonic() + timeout
    while not got or (got[-1].type, got[-1].path) != (kind, path):
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind} {path} within {timeout} s; got {got}"
        for event in watch.read(timeout=left):
            got.append(event)
            if (event.type, event.path) == (kind, path):
                break
    return got


def _watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("mentis-watch-")]


def _seen(events: list[mentis.FileEvent]) -> list[tuple[str, str, bool]]:
    return [(e.type, e.path, e.is_dir) for e in events]


def test_a_recursive_watch_reports_what_is_made_written_moved_and_removed_in_order_each_once(sb):
    sb.files.mkdir("rw")
    started = datetime.datetime.now(datetime.timezone.utc)
    with sb.files.watch("rw", recursive=True) as watch:
        assert isinstance(watch, mentis.FileWatch)
        assert watch.watch_id.startswith("watch-") and watch.last_seq == 0
        assert watch._thread.name == f"mentis-watch-{watch.watch_id}" and watch._thread.is_alive()
        sb.files.mkdir("rw/sub")
        got = _until(watch, "created", "rw/sub")
        sb.run("echo one > rw/sub/f.txt")  # a directory made later is followed too
        got += _until(watch, "modified", "rw/sub/f.txt")
        time.sleep(0.2)  # past the 50 ms in which writes to one file are one event
        sb.run("echo two >> rw/sub/f.txt")
        got += _until(watch, "modified", "rw/sub/f.txt")
        sb.run("rm rw/sub/f.txt")
        got += _until(watch, "removed", "rw/sub/f.txt")
        sb.files.rename("rw/sub", "rw/moved")
        got += _until(watch, "created", "rw/moved")
        sb.run(": > rw/moved/g")  # followed under its new name
        got += _until(watch, "created", "rw/moved/g")
        sb.files.remove("rw/moved", recursive=True)
        got += _until(watch, "removed", "rw/moved")
        sb.run(": > outside.txt && mkdir -p rwx && : > rwx/f")  # not under the watched directory
        assert watch.read(timeout=0.5) == []
    assert _seen(got) == [
        ("created", "rw/sub", True),
        ("created", "rw/sub/f.txt", False),
        ("modified", "rw/sub/f.txt", False),
        ("modified", "rw/sub/f.txt", False),
        ("removed", "rw/sub/f.txt", False),
        ("removed", "rw/sub", True),
        ("created", "rw/moved", True),
        ("created", "rw/moved/g", False),
        ("removed", "rw/moved/g", False),
        ("removed", "rw/moved", True),
    ]
    assert [e.seq for e in got] == list(range(1, 11)) and watch.last_seq == 10
    assert all(isinstance(e, mentis.FileEvent) and e.missed == 0 for e in got)
    times = [e.time for e in got]
    assert times == sorted(times) and started - datetime.timedelta(seconds=5) < times[0]
    # The block closed it: its thread has ended.
    assert not watch._thread.is_alive()
    assert watch.read(timeout=0.1) == []


def test_a_watch_without_recursive_reports_only_its_own_directory_and_iterates(sb):
    sb.run("mkdir -p flat/deep")
    with sb.files.watch("flat") as watch:
        sb.run(": > flat/deep/inner.txt && mkdir flat/deep/more && : > flat/top.txt && mkdir flat/new")
        sb.run(": > flat/new/not-followed.txt && rm flat/top.txt")
        got = []
        for event in watch:  # as they come
            got.append(event)
            if event.type == "removed":
                break
        assert _seen(got) == [
            ("created", "flat/top.txt", False),
            ("created", "flat/new", True),
            ("removed", "flat/top.txt", False),
        ]
        # Leaving the loop lost nothing: the next one goes on from there.
        sb.run(": > flat/after.txt")
        assert _seen([next(iter(watch))]) == [("created", "flat/after.txt", False)]
        # The workspace itself, by default.
    with sb.files.watch() as whole:
        sb.run(": > top-level.txt && : > flat/below.txt")
        assert _seen(_until(whole, "created", "top-level.txt")) == [("created", "top-level.txt", False)]


def test_a_watch_is_read_again_by_its_id_after_its_last_event_from_here_and_another_process(runtime, sb):
    sb.files.mkdir("rs")
    watch = sb.files.watch("rs")
    sb.run("echo 1 > rs/a")
    first = _until(watch, "modified", "rs/a")
    watch.close()
    assert not watch._thread.is_alive()
    watch.close()  # twice: no error
    assert (watch.last_seq, _seen(first)) == (2, [("created", "rs/a", False), ("modified", "rs/a", False)])

    sb.run("echo 2 > rs/b && rm rs/a")  # while nobody reads it
    with sb.files.attach_watch(watch.watch_id, after_seq=watch.last_seq) as again:
        assert again.watch_id == watch.watch_id
        rest = _until(again, "removed", "rs/a")
        sb.run(": > rs/c")  # then live
        rest += _until(again, "created", "rs/c")
    assert [(e.seq, e.type, e.path) for e in rest] == [
        (3, "created", "rs/b"),
        (4, "modified", "rs/b"),
        (5, "removed", "rs/a"),
        (6, "created", "rs/c"),
    ]
    # after_seq 0: every event still kept; and from another process, knowing the sandbox and the watch id.
    with sb.files.attach_watch(watch.watch_id) as whole:
        assert [e.seq for e in _until(whole, "created", "rs/c")] == [1, 2, 3, 4, 5, 6]
    script = (
        "import sys\n"
        "from mentis import Sandbox\n"
        "with Sandbox.connect(sys.argv[1], addr=sys.argv[3], api_key=sys.argv[4]) as sb:\n"
        "    with sb.files.attach_watch(sys.argv[2], after_seq=4) as w:\n"
        "        for e in w:\n"
        "            print(e.seq, e.type, e.path)\n"
        "            if e.seq == 6:\n"
        "                break\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, sb.id, watch.watch_id, runtime.addr, runtime.key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (out.returncode, out.stdout) == (0, "5 removed rs/a\n6 created rs/c\n"), out.stderr


def test_events_a_reader_fell_too_far_behind_for_are_a_gap_event(sb):
    sb.files.mkdir("many")
    watch = sb.files.watch("many")
    watch.close()
    # 5000 events while nobody reads: the watch keeps its newest 4096.
    assert sb.run("cd many && for i in $(seq 1 5000); do : > f$i; done").ok
    with sb.files.attach_watch(watch.watch_id) as again:
        got = _until(again, "created", "many/f5000")
    gap = got[0]
    assert (gap.type, gap.seq, gap.missed, gap.path, gap.time) == ("gap", 904, 904, "", None)
    assert [e.seq for e in got[1:]] == list(range(905, 5001))
    assert [e.path for e in got[1:3]] == ["many/f905", "many/f906"]
    assert again.last_seq == 5000
    # A reader that resumes after the gap does not get it again.
    with sb.files.attach_watch(watch.watch_id, after_seq=904) as after:
        assert after.read(timeout=10)[0].seq == 905


def test_on_event_is_called_from_the_watchs_thread_which_close_and_errors_end(runtime, sb):
    sb.files.mkdir("cb")
    seen: list[tuple[mentis.FileEvent, threading.Thread]] = []

    def on_event(event: mentis.FileEvent) -> None:
        seen.append((event, threading.current_thread()))
        if event.path == "cb/stop":
            watch.close()  # from the callback: no join of its own thread

    watch = sb.files.watch("cb", on_event=on_event)
    with pytest.raises(TimeoutError):
        watch.wait(timeout=0.2)
    sb.run(": > cb/a && : > cb/stop && : > cb/late")
    watch.wait(timeout=30)  # returns once the callback closed it
    assert _seen([e for e, _ in seen]) == [("created", "cb/a", False), ("created", "cb/stop", False)]
    assert {t for _, t in seen} == {watch._thread} and watch._thread is not threading.current_thread()
    watch._thread.join(timeout=10)
    assert not watch._thread.is_alive()
    with pytest.raises(mentis.MentisError, match="on_event"):
        watch.read()

    def boom(event: mentis.FileEvent) -> None:
        raise RuntimeError(f"callback saw {event.path}")

    failing = sb.files.watch("cb", on_event=boom)
    sb.run(": > cb/b")
    with pytest.raises(RuntimeError, match="callback saw cb/b"):
        failing.wait(timeout=30)
    assert not failing._thread.is_alive()
    failing.close()  # no error

    # Closing the sandbox's connection closes its watches.
    other = Sandbox.connect(sb.id, addr=runtime.addr, api_key=runtime.key)
    followed = other.files.watch("cb")
    other.close()
    assert not followed._thread.is_alive()
    assert followed.read(timeout=1) == []


def test_a_watch_stream_cut_by_the_network_is_opened_again_and_every_event_arrives_once(runtime, proxy):
    with Sandbox.create(addr=proxy.addr, api_key=runtime.key) as sandbox:
        sandbox.files.mkdir("net")
        with Sandbox.connect(sandbox.id, addr=runtime.addr, api_key=runtime.key) as direct:  # not cut
            watch = sandbox.files.watch("net")
            writer = direct.run("for i in $(seq 1 40); do : > net/f$i; sleep 0.03; done", background=True)
            got = []
            for event in watch:
                got.append(event)
                if proxy.cuts == 0 and event.path == "net/f10":
                    proxy.cut()
                if event.path == "net/f40":
                    break
            assert writer.wait(timeout=60).ok
            watch.close()
        assert proxy.cuts == 1
        assert [e.path for e in got] == [f"net/f{i}" for i in range(1, 41)]
        assert [e.seq for e in got] == list(range(1, 41))


def test_watch_mistakes_are_typed_errors_raised_at_once(runtime, sb):
    sb.files.write("plain.txt", "x")
    with pytest.raises(mentis.InvalidArgument):
        sb.files.watch("plain.txt")
    with pytest.raises(mentis.NotFound) as missing:
        sb.files.watch("no/such/dir")
    assert missing.value.reason == "PATH_NOT_FOUND"
    with pytest.raises(mentis.InvalidArgument):
        sb.files.watch("../etc")
    with pytest.raises(mentis.NotFound) as gone:
        sb.files.attach_watch("watch-000000000000")
    assert gone.value.reason == "PATH_NOT_FOUND"
    with pytest.raises(mentis.InvalidArgument) as bad:
        sb.files.attach_watch("not a watch id")
    assert bad.value.field == "watch_id"
    watch = sb.files.watch()
    watch.close()
    with pytest.raises(mentis.OutOfRange) as beyond:
        sb.files.attach_watch(watch.watch_id, after_seq=10**6)
    assert beyond.value.reason == "SEQ_OUT_OF_RANGE"
    # Refused here, before any call: an empty id would start a new watch of the whole workspace.
    for watch_id, after_seq in (("", 0), (None, 0), (watch.watch_id, -1), (watch.watch_id, True)):
        with pytest.raises(mentis.InvalidArgument) as local:
            sb.files.attach_watch(watch_id, after_seq=after_seq)  # type: ignore[arg-type]
        assert local.value.field in ("watch_id", "after_seq")

    # A sandbox keeps at most 16 watches: while each has a reader a 17th is refused; once they are closed,
    # a new one ends the one read least recently.
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as full:
        watches = [full.files.watch() for _ in range(16)]
        with pytest.raises(mentis.FailedPrecondition):
            full.files.watch()
        for w in watches:
            w.close()
            time.sleep(0.05)
        deadline = time.monotonic() + 15
        while True:
            try:
                newest = full.files.watch()
                break
            except mentis.FailedPrecondition:
                assert time.monotonic() < deadline, "no place for a new watch after closing 16"
                time.sleep(0.2)
        newest.close()
        with pytest.raises(mentis.NotFound):
            full.files.attach_watch(watches[0].watch_id)
        with full.files.attach_watch(watches[1].watch_id):
            pass
    assert _watch_threads() == []


def test_the_async_api_watches_files(runtime, env, proxy):
    async def until(watch, kind: str, path: str) -> list[mentis.FileEvent]:
        got: list[mentis.FileEvent] = []

        async def collect() -> list[mentis.FileEvent]:
            async for event in watch:
                got.append(event)
                if (event.type, event.path) == (kind, path):
                    return got
            raise AssertionError(f"the watch ended before {kind} {path}: {got}")

        return await asyncio.wait_for(collect(), 30)

    async def main():
        async with AsyncSandbox.create() as sb:
            await sb.files.mkdir("aw")
            async with sb.files.watch("aw", recursive=True) as watch:
                assert isinstance(watch, mentis.AsyncFileWatch) and watch.watch_id.startswith("watch-")
                await sb.files.mkdir("aw/sub")
                got = await until(watch, "created", "aw/sub")
                await sb.run("echo x > aw/sub/f")
                got += await until(watch, "modified", "aw/sub/f")
                await sb.run("rm aw/sub/f")
                got += await until(watch, "removed", "aw/sub/f")
                assert await watch.read(timeout=0.3) == []
            assert _seen(got) == [
                ("created", "aw/sub", True),
                ("created", "aw/sub/f", False),
                ("modified", "aw/sub/f", False),
                ("removed", "aw/sub/f", False),
            ]
            assert watch._task.done() and watch.last_seq == 4

            # Read again after its last event; then from the start.
            await sb.run(": > aw/later")
            again = await sb.files.attach_watch(watch.watch_id, after_seq=watch.last_seq)
            assert _seen(await until(again, "created", "aw/later")) == [("created", "aw/later", False)]
            await again.close()
            async with sb.files.attach_watch(watch.watch_id) as whole:
                assert [e.seq for e in await until(whole, "created", "aw/later")] == [1, 2, 3, 4, 5]

            # on_event on the event loop; its error ends the watch and wait raises it.
            loop = asyncio.get_running_loop()
            seen: list[tuple[str, bool]] = []
            called = await sb.files.watch("aw", on_event=lambda e: seen.append((e.path, loop.is_running())))
            with pytest.raises(TimeoutError):
                await called.wait(timeout=0.2)
            await sb.run(": > aw/cb")
            for _ in range(1500):
                if seen:
                    break
                await asyncio.sleep(0.02)
            assert seen == [("aw/cb", True)]
            with pytest.raises(mentis.MentisError, match="on_event"):
                await called.read()
            await called.close()
            assert called._task.done()

            def boom(event: mentis.FileEvent) -> None:
                raise RuntimeError(f"callback saw {event.path}")

            failing = await sb.files.watch("aw", on_event=boom)
            await sb.run(": > aw/boom")
            with pytest.raises(RuntimeError, match="callback saw aw/boom"):
                await failing.wait(timeout=30)
            await failing.close()

            with pytest.raises(mentis.InvalidArgument):
                await sb.files.watch("aw/later")
            with pytest.raises(mentis.NotFound):
                await sb.files.attach_watch("watch-000000000000")
            with pytest.raises(mentis.InvalidArgument):
                sb.files.attach_watch("")

            # Closing the connection closes the watches it reads.
            other = await AsyncSandbox.connect(sb.id)
            followed = await other.files.watch("aw")
            await other.close()
            assert followed._task.done() and await followed.read(timeout=0.1) == []
            assert [t for t in asyncio.all_tasks() if "_read_stream" in repr(t.get_coro())] == []

        async with AsyncSandbox.create(addr=proxy.addr, api_key=runtime.key) as cut:
            await cut.files.mkdir("net")
            async with cut.files.watch("net") as watch:
                direct = await AsyncSandbox.connect(cut.id)
                try:
                    writer = await direct.run(
                        "for i in $(seq 1 30); do : > net/f$i; sleep 0.03; done", background=True
                    )
                    got = []
                    async for event in watch:
                        got.append(event)
                        if proxy.cuts == 0 and event.path == "net/f10":
                            proxy.cut()
                        if event.path == "net/f30":
                            break
                    assert (await writer.wait(timeout=60)).ok
                finally:
                    await direct.close()
            assert proxy.cuts == 1
            assert [e.path for e in got] == [f"net/f{i}" for i in range(1, 31)]
            assert [e.seq for e in got] == list(range(1, 31))

    asyncio.run(main())


def test_the_guides_watch_example_runs_as_written(env, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "watch")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "created src/app.py",
        "modified src/app.py",
        "removed src/app.py",
    ]
