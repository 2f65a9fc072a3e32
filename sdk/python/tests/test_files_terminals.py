"""Upload, download and terminals, with both APIs, against a real runtime and real sandboxes."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import pathlib
import stat
import tarfile
import time

import pytest
from mentis.v1 import file_pb2

import mentis
from mentis import AsyncSandbox, Sandbox


@pytest.fixture(scope="module")
def sb(runtime):
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        yield sandbox


# --- trees to copy and compare


def _make_tree(root: pathlib.Path) -> None:
    """A tree with what a copy has to keep: modes, an empty directory, a file over the SDK's 1 MiB chunk, an
    empty file, a symbolic link, a hard link, a non-ASCII name and a name longer than tar's 100 bytes."""
    (root / "bin").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "bin" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "bin" / "run.sh").chmod(0o751)
    (root / "secret").write_bytes(b"s")
    (root / "secret").chmod(0o600)
    (root / "empty").mkdir()
    (root / "empty").chmod(0o700)
    deep = root / "deep" / "x" / "y"
    deep.mkdir(parents=True)
    (deep / "big.bin").write_bytes(os.urandom(2_500_000))
    (deep / "zero").write_bytes(b"")
    (root / "link").symlink_to("a.txt")
    os.link(root / "a.txt", root / "hard")
    (root / "café.txt").write_text("crème\n")
    (root / ("long-" + "n" * 120 + ".txt")).write_text("long\n")


def _local_tree(root: pathlib.Path) -> dict[str, tuple]:
    """Every entry under `root`: ("dir", mode), ("file", mode, sha256) or ("link", target)."""
    tree: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = pathlib.Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                tree[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                tree[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                tree[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(path.read_bytes()).hexdigest())
    return tree


def _remote_tree(sb: Sandbox, root: str) -> dict[str, tuple]:
    """The same, as the sandbox's own find and sha256sum see it (not through the SDK's download)."""
    listing = sb.run(f"cd {root} && find . -mindepth 1 -printf '%P\\t%y\\t%m\\t%l\\n'")
    sums = sb.run(f"cd {root} && find . -type f -exec sha256sum {{}} +")
    assert listing.ok and sums.ok, (listing.stderr, sums.stderr)
    digest = {}
    for line in sums.stdout.splitlines():
        value, path = line.split("  ", 1)
        digest[path.removeprefix("./")] = value
    tree: dict[str, tuple] = {}
    for line in listing.stdout.splitlines():
        path, kind, mode, target = line.split("\t")
        if kind == "l":
            tree[path] = ("link", target)
        elif kind == "d":
            tree[path] = ("dir", int(mode, 8))
        else:
            tree[path] = ("file", int(mode, 8), digest[path])
    return tree


# --- upload and download (sync)


def test_a_directory_tree_goes_up_and_comes_back_with_contents_modes_and_links(sb, tmp_path):
    src = tmp_path / "src"
    _make_tree(src)
    local = _local_tree(src)
    assert len(local) == 14

    # Up: a missing destination becomes the directory; an existing one gets it inside, like cp -r.
    assert sb.files.upload(src, "up") == "up"
    assert _remote_tree(sb, "up") == local
    inodes = sb.run("stat -c %i up/a.txt up/hard").stdout.split()
    assert len(inodes) == 2 and inodes[0] == inodes[1], "the hard link was not kept"
    assert sb.files.upload(src, "up") == "up/src"
    assert _remote_tree(sb, "up/src") == local

    # Down: the same two ways.
    down = tmp_path / "down"
    assert sb.files.download("up/src", down) == str(down)
    assert _local_tree(down) == local
    assert sb.files.download("up/src", down) == str(down / "src")
    assert _local_tree(down / "src") == local
    # A download over an older copy replaces what changed and keeps the rest.
    sb.run("echo changed > up/src/a.txt && rm up/src/secret")
    (down / "mine.txt").write_text("local only")
    sb.files.download("up/src", str(down))
    assert (down / "src" / "a.txt").read_text() == "changed\n"
    assert (down / "src" / "secret").exists()
    assert (down / "mine.txt").read_text() == "local only"


def test_a_single_file_goes_as_a_file_and_keeps_its_mode_both_ways(sb, tmp_path):
    data = os.urandom(1_300_000)
    local = tmp_path / "tool.bin"
    local.write_bytes(data)
    local.chmod(0o751)

    # Into a directory ("" is the workspace, a trailing slash or an existing directory): under its own name.
    assert sb.files.upload(local, "") == "tool.bin"
    assert sb.files.upload(local, "single/") == "single/tool.bin"
    assert sb.files.upload(str(local), "single") == "single/tool.bin"
    # Anywhere else: that path, parent directories made.
    assert sb.files.upload(local, "single/sub/renamed.bin") == "single/sub/renamed.bin"
    for path in ("tool.bin", "single/tool.bin", "single/sub/renamed.bin"):
        assert sb.files.read(path) == data
        assert sb.files.stat(path).mode == 0o751
    assert sb.run("sha256sum < single/sub/renamed.bin").stdout.split()[0] == hashlib.sha256(data).hexdigest()

    sb.run("chmod 640 single/sub/renamed.bin && touch -d @1700000000 single/sub/renamed.bin")
    got = tmp_path / "got" / "copy.bin"  # its folder is made
    assert sb.files.download("single/sub/renamed.bin", got) == str(got)
    assert got.read_bytes() == data
    assert stat.S_IMODE(got.stat().st_mode) == 0o640
    assert int(got.stat().st_mtime) == 1700000000
    # Into an existing local directory: under its own name, replacing an older file whole.
    (tmp_path / "got" / "renamed.bin").write_text("old")
    assert sb.files.download("single/sub/renamed.bin", tmp_path / "got") == str(
        tmp_path / "got" / "renamed.bin"
    )
    assert (tmp_path / "got" / "renamed.bin").read_bytes() == data
    assert sorted(os.listdir(tmp_path / "got")) == ["copy.bin", "renamed.bin"]  # no staging left behind


def test_copy_mistakes_are_typed_errors_and_change_nothing(sb, tmp_path):
    with pytest.raises(mentis.NotFound) as missing:
        sb.files.download("no/such/thing", tmp_path / "x")
    assert missing.value.reason == "PATH_NOT_FOUND"
    assert not (tmp_path / "x").exists()
    with pytest.raises(mentis.InvalidArgument):
        sb.files.download("../etc", tmp_path)
    with pytest.raises(FileNotFoundError):
        sb.files.upload(tmp_path / "absent", "")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="neither a file nor a directory"):
        sb.files.upload(tmp_path / "fifo", "")
    (tmp_path / "f").write_text("f")
    with pytest.raises(mentis.InvalidArgument):
        sb.files.upload(tmp_path / "f", "../outside.txt")
    # A link out of the directory refuses the whole upload: nothing lands.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "fine.txt").write_text("fine")
    (bad / "escape").symlink_to("/etc/passwd")
    with pytest.raises(mentis.InvalidArgument):
        sb.files.upload(bad, "refused")
    with pytest.raises(mentis.NotFound):
        sb.files.stat("refused")


def _partial_archive() -> bytes:
    """One complete entry and no end-of-archive blocks: what an upload that stopped early would have sent."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("f.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    return buf.getvalue()[:1024]


def _failing(first: bytes):
    yield first
    raise OSError("the local disk went away")


def test_a_local_read_that_fails_mid_upload_cancels_it_and_commits_nothing(sb):
    # A stream ended cleanly after a whole entry would be committed (the runtime takes an archive that ends at
    # an entry's boundary); a local error must cancel it instead, and be the error raised.
    sb.files.write("kept.txt", "old")
    header = file_pb2.WriteFileRequest(header=file_pb2.WriteFileHeader(sandbox_id=sb.id, path="kept.txt"))
    with pytest.raises(OSError, match="went away"):
        mentis.sandbox._send(
            sb._conn.files.WriteFile, header, _failing(b"new"), lambda d: file_pb2.WriteFileRequest(data=d)
        )
    assert sb.files.read_text("kept.txt") == "old"
    header = file_pb2.UploadRequest(header=file_pb2.UploadHeader(sandbox_id=sb.id, path="cut"))
    with pytest.raises(OSError, match="went away"):
        mentis.sandbox._send(
            sb._conn.files.Upload,
            header,
            _failing(_partial_archive()),
            lambda d: file_pb2.UploadRequest(data=d),
        )
    with pytest.raises(mentis.NotFound):
        sb.files.stat("cut/f.txt")
    # The directory the runtime made to unpack into is removed as it sees the cancel, a moment later.
    assert _gone_soon(sb, "cut")


def _gone_soon(sb: Sandbox, path: str) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            sb.files.stat(path)
        except mentis.NotFound:
            return True
        time.sleep(0.02)
    return False


# --- terminals (sync)


def test_a_terminal_runs_bash_echoes_resizes_and_exits_with_its_code(sb):
    with sb.terminals.open(rows=24, cols=80) as term:
        assert (term.rows, term.cols) == (24, 80)
        term.write("echo hi-$((6 * 7))\n")  # the echo of what was typed has no "hi-42"
        assert b"hi-42" in term.read_until("hi-42")
        term.write(b"stty size\n")
        term.read_until("24 80")
        term.resize(rows=40, cols=123)
        term.write("stty size\n")
        term.read_until("40 123")
        (listed,) = [t for t in sb.terminals.list() if t.id == term.id]
        assert (listed.rows, listed.cols, listed.attached, listed.exit_code) == (40, 123, 1, None)
        assert listed.command == ["/bin/bash", "-l"] and listed.pid > 0 and listed.created_at
        assert term.exit_code is None
        term.write("exit 3\n")
        assert term.wait(timeout=30) == 3
        assert (term.exit_code, term.signal) == (3, 0)
    # The block closed it: the sandbox forgot it.
    assert term.id not in [t.id for t in sb.terminals.list()]


def test_terminal_output_is_iterated_or_called_back_and_signals_reach_the_program(sb):
    term = sb.terminals.open(["sh", "-c", "printf 'one\\ntwo\\n'; exit 2"], env={"X": "1"}, cwd="/tmp")
    assert b"".join(term) == b"one\r\ntwo\r\n"  # the terminal turns \n into \r\n
    assert term.wait() == 2
    term.close()

    seen: list[bytes] = []
    with sb.terminals.open(
        ["sh", "-c", "echo $X $(pwd)"], env={"X": "env-ok"}, cwd="/tmp", on_output=seen.append
    ) as t:
        assert t.wait(timeout=30) == 0
        with pytest.raises(mentis.MentisError, match="on_output"):
            t.read()
    assert b"".join(seen) == b"env-ok /tmp\r\n"

    with sb.terminals.open(["sleep", "100"]) as sleeper:
        sleeper.send_signal("SIGINT")
        assert sleeper.wait(timeout=30) == 130
        assert sleeper.signal == 2

    # close() hangs up a program that runs: SIGHUP.
    hung = sb.terminals.open(["sleep", "100"])
    hung.close()
    assert (hung.exit_code, hung.signal) == (129, 1)
    assert hung.id not in [t.id for t in sb.terminals.list()]
    hung.close()  # twice is no error


def test_a_detached_terminal_runs_on_and_is_attached_again_with_its_scrollback(sb):
    term = sb.terminals.open()
    term.write("export K=kept; echo before-$((1 + 1))\n")
    term.read_until("before-2")
    seq = term.last_seq
    term.detach()
    with pytest.raises(mentis.FailedPrecondition):
        term.write("echo lost\n")
    listed = _listed_when(sb, term.id, lambda t: t.attached == 0)
    assert (listed.attached, listed.exit_code) == (0, None)  # it runs on, with no client

    again = sb.terminals.attach(term.id)
    assert b"before-2" in again.read_until("before-2", timeout=10)  # the scrollback, replayed
    again.write("echo $K-after\n")
    again.read_until("kept-after")
    # An attach after a seq replays only what followed it.
    later = sb.terminals.attach(term.id, after_seq=seq)
    assert b"kept-after" in later.read_until("kept-after", timeout=10)
    later.detach()
    again.write("exit 4\n")
    assert again.wait(timeout=30) == 4
    sb.terminals.close(term.id)  # an ended terminal is forgotten
    assert term.id not in [t.id for t in sb.terminals.list()]


def test_a_terminal_detached_in_its_with_block_runs_on_after_the_block(sb):
    # The end of the block hangs up only a terminal that is still attached: one detached in it runs on.
    with sb.terminals.open() as term:
        term.write("export K=kept-in-block; echo in-$((2 + 2))\n")
        term.read_until("in-4")
        term.detach()
    listed = _listed_when(sb, term.id, lambda t: t.attached == 0)
    assert (listed.attached, listed.exit_code) == (0, None)
    with sb.terminals.attach(term.id) as again:
        again.read_until("in-4", timeout=10)  # the scrollback, replayed
        again.write("echo $K\n")
        again.read_until("kept-in-block\r\n")
    # This block's end closed it: hung up and forgotten.
    assert term.id not in [t.id for t in sb.terminals.list()]


def _listed_when(sb: Sandbox, terminal_id: str, ready) -> mentis.TerminalInfo:
    """The terminal as ListTerminals shows it once `ready` (the runtime sees a stream go a moment later)."""
    deadline = time.monotonic() + 10
    while True:
        (listed,) = [t for t in sb.terminals.list() if t.id == terminal_id]
        if ready(listed) or time.monotonic() > deadline:
            return listed
        time.sleep(0.05)


def test_terminal_mistakes_are_typed_errors(sb):
    with pytest.raises(mentis.InvalidArgument):
        sb.terminals.open("bash -l")  # argv, not a command line
    with pytest.raises(mentis.InvalidArgument):
        sb.terminals.open(rows=5000)
    with pytest.raises(mentis.NotFound) as missing:
        sb.terminals.attach("term-000000000000")
    assert missing.value.reason == "TERMINAL_NOT_FOUND"
    with pytest.raises(mentis.InvalidArgument):
        sb.terminals.attach("not a terminal id")
    with pytest.raises(mentis.NotFound):
        sb.terminals.close("term-000000000000")
    with pytest.raises(mentis.FailedPrecondition):
        sb.terminals.open(["/no/such/program"])
    with sb.terminals.open(["cat"]) as cat:
        with pytest.raises(mentis.InvalidArgument):
            cat.resize(rows=0, cols=80)
        with pytest.raises(mentis.InvalidArgument):
            cat.send_signal("NOPE")
        # Refused before they were sent: the terminal still works.
        cat.write("still\n")
        cat.read_until("still\r\nstill")  # the echo, then cat's copy
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            cat.read_until("never", timeout=0.5)
        assert time.monotonic() - started < 5
        with pytest.raises(TimeoutError):
            cat.wait(timeout=0.2)
        cat.write("\x04")  # Ctrl-D: cat ends
        with pytest.raises(EOFError):
            cat.read_until("never", timeout=30)
        assert cat.wait(timeout=30) == 0
        with pytest.raises(mentis.FailedPrecondition):
            cat.write("late")


def test_a_terminal_stream_cut_by_the_network_is_attached_again_and_every_byte_arrives_once(runtime, proxy):
    with Sandbox.create(addr=proxy.addr, api_key=runtime.key) as sandbox:
        term = sandbox.terminals.open(
            ["sh", "-c", "for i in $(seq 1 60); do echo n$i; sleep 0.03; done; exit 9"]
        )
        seen = bytearray()
        for chunk in term:
            seen += chunk
            if proxy.cuts == 0 and b"n10\r\n" in seen:
                proxy.cut()
        assert proxy.cuts == 1
        assert term.wait(timeout=10) == 9
        assert seen.decode().split() == [f"n{i}" for i in range(1, 61)]


def test_closing_the_sandbox_connection_detaches_its_terminals(runtime):
    made = Sandbox.create(addr=runtime.addr, api_key=runtime.key)
    try:
        term = made.terminals.open(["sleep", "300"])
        made.close()
        # Its stream ended with the connection (and was not attached again on a new one).
        term._reader.join(timeout=10)
        assert not term._reader.is_alive()
        with Sandbox.connect(made.id, addr=runtime.addr, api_key=runtime.key) as again:
            listed = _listed_when(again, term.id, lambda t: t.attached == 0)
            assert (listed.attached, listed.exit_code) == (0, None)
    finally:
        with Sandbox.connect(made.id, addr=runtime.addr, api_key=runtime.key) as cleanup:
            cleanup.delete()


@pytest.fixture(scope="module")
def runtime_without_web():
    """A runtime that serves no HTTP listener (no MENTIS_HTTP_LISTEN): it makes no links."""
    import conftest

    rt = conftest.Runtime(os.environ["MENTIS_RUNTIME_BIN"], http=False)
    yield rt
    rt.stop()


def test_a_runtime_without_the_web_listener_makes_no_links(runtime_without_web):
    rt = runtime_without_web
    with Sandbox.create(addr=rt.addr, api_key=rt.key) as sb, pytest.raises(mentis.FailedPrecondition):
        sb.terminals.link()


def test_a_terminal_link_opens_the_web_terminal(runtime):
    import datetime
    import urllib.request

    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        term = sandbox.terminals.open()
        link = sandbox.terminals.link(term.id, ttl=120)
        assert link.path == f"/terminal#token={link.token}" and link.token
        now = datetime.datetime.now(datetime.timezone.utc)
        assert now < link.expires_at <= now + datetime.timedelta(seconds=121)
        page_url = f"http://{runtime.http_addr}{link.path.split('#')[0]}"
        with urllib.request.urlopen(page_url, timeout=10) as page:
            assert page.status == 200
        with pytest.raises(mentis.InvalidArgument):
            sandbox.terminals.link(ttl=13 * 3600)
        term.close()


# --- the asyncio API


def test_the_async_api_copies_files_and_drives_terminals(env, tmp_path):
    src = tmp_path / "src"
    _make_tree(src)
    local = _local_tree(src)
    single = tmp_path / "one.sh"
    single.write_text("#!/bin/sh\necho one\n")
    single.chmod(0o700)

    async def main():
        async with AsyncSandbox.create() as sb:
            assert await sb.files.upload(src, "up") == "up"
            assert await sb.files.upload(src, "up") == "up/src"
            assert await sb.files.upload(single, "bin/") == "bin/one.sh"
            assert (await sb.files.stat("bin/one.sh")).mode == 0o700
            assert (await sb.run("bin/one.sh")).stdout == "one\n"
            assert await sb.files.download("up", tmp_path / "down") == str(tmp_path / "down")
            assert await sb.files.download("bin/one.sh", tmp_path / "down") == str(
                tmp_path / "down" / "one.sh"
            )
            with pytest.raises(mentis.NotFound):
                await sb.files.download("missing", tmp_path / "down")

            async with sb.terminals.open(rows=24, cols=80) as term:
                await term.write("echo hi-$((6 * 7))\n")
                await term.read_until("hi-42")
                await term.resize(rows=33, cols=77)
                await term.write("stty size\n")
                await term.read_until("33 77")
                (listed,) = [t for t in await sb.terminals.list() if t.id == term.id]
                assert (listed.rows, listed.cols) == (33, 77)
                await term.detach()
                async with sb.terminals.attach(term.id) as again:
                    await again.read_until("33 77")  # replayed
                    await again.detach()
                # Detached in its block: it runs on after it.
                (listed,) = [t for t in await sb.terminals.list() if t.id == term.id]
                assert listed.exit_code is None
                async with sb.terminals.attach(term.id) as again:
                    await again.read_until("33 77")  # replayed
                    await again.write("exit 6\n")
                    assert await again.wait(timeout=30) == 6
            assert term.id not in [t.id for t in await sb.terminals.list()]

            term = await sb.terminals.open(["sh", "-c", "printf 'a\\nb\\n'; exit 1"])
            assert b"".join([chunk async for chunk in term]) == b"a\r\nb\r\n"
            assert await term.wait() == 1
            await term.close()

            sleeper = await sb.terminals.open(["sleep", "100"])
            await sleeper.send_signal("TERM")
            assert (await sleeper.wait(timeout=30), sleeper.signal) == (143, 15)
            with pytest.raises(mentis.FailedPrecondition):
                await sleeper.write("late")
            await sleeper.close()

            with pytest.raises(mentis.NotFound):
                await sb.terminals.attach("term-000000000000")
            with pytest.raises(mentis.InvalidArgument):
                await sb.terminals.open(cols=1001)
            async with sb.terminals.open(["cat"]) as cat:
                with pytest.raises(mentis.InvalidArgument):
                    await cat.resize(rows=10, cols=0)
                with pytest.raises(TimeoutError):
                    await cat.read_until("never", timeout=0.3)
                with pytest.raises(TimeoutError):
                    await cat.wait(timeout=0.2)

            header = file_pb2.UploadRequest(header=file_pb2.UploadHeader(sandbox_id=sb.id, path="cut"))
            with pytest.raises(OSError, match="went away"):
                await mentis.aio._send(
                    sb._conn,
                    sb._conn.files.Upload,
                    header,
                    _failing(_partial_archive()),
                    lambda d: file_pb2.UploadRequest(data=d),
                )
            with pytest.raises(mentis.NotFound):
                await sb.files.stat("cut/f.txt")  # nothing committed
            for _ in range(500):  # and the directory made to unpack into goes as the runtime sees the cancel
                try:
                    await sb.files.stat("cut")
                except mentis.NotFound:
                    break
                await asyncio.sleep(0.02)
            else:
                pytest.fail("the cancelled upload's directory stayed")

    asyncio.run(main())
    expected = dict(local)
    expected["src"] = ("dir", 0o755)  # made by the upload into "up" (an archive carries no mode for its root)
    expected.update({f"src/{k}": v for k, v in local.items()})
    expected["one.sh"] = ("file", 0o700, hashlib.sha256(single.read_bytes()).hexdigest())
    assert _local_tree(tmp_path / "down") == expected


def test_an_async_terminal_stream_cut_by_the_network_is_attached_again(runtime, proxy):
    async def main():
        async with AsyncSandbox.create(addr=proxy.addr, api_key=runtime.key) as sb:
            term = await sb.terminals.open(
                ["sh", "-c", "for i in $(seq 1 60); do echo n$i; sleep 0.03; done; exit 9"]
            )
            seen = bytearray()
            async for chunk in term:
                seen += chunk
                if proxy.cuts == 0 and b"n10\r\n" in seen:
                    proxy.cut()
            assert proxy.cuts == 1
            assert await term.wait(timeout=10) == 9
            assert seen.decode().split() == [f"n{i}" for i in range(1, 61)]

    asyncio.run(main())


# --- the guide


def test_the_guides_files_and_terminals_example_runs_as_written(env, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "files-terminals")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "app",
        "hi from main",
        "done",
        "logs/today",
        "logs/2026-01-31",
        "3",
    ]
