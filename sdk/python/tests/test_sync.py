"""The synchronous API against a real runtime and real sandboxes."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

import mentis
from mentis import Sandbox


@pytest.fixture(scope="module")
def sb(runtime):
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        yield sandbox


def test_a_command_gives_its_exit_code_streams_and_live_output(sb):
    live = []
    r = sb.run("echo out; echo err >&2; printf 'caf\\xc3'; printf '\\xa9\\n'; exit 3", on_stdout=live.append)
    assert (r.exit_code, r.reason, r.ok) == (3, "exited", False)
    assert r.stdout == "out\ncafé\n"
    assert r.stderr == "err\n"
    # A character split across two writes reaches the callback whole.
    assert "".join(live) == "out\ncafé\n"
    assert r.action_id


def test_env_cwd_stdin_and_timeout(sb):
    r = sb.run("mkdir -p sub && cd sub && pwd", cwd="")
    assert r.stdout.strip().endswith("/sub")
    assert sb.run("echo $A-$B", env={"A": "1", "B": "2"}).stdout == "1-2\n"
    assert sb.run("cat", stdin=b"fed\n").stdout == "fed\n"
    assert sb.run("pwd", cwd="sub").stdout.strip().endswith("/sub")
    slow = sb.run("sleep 30", timeout=1)
    assert slow.reason == "timed_out"
    assert slow.exit_code == -1


def test_a_session_keeps_cwd_and_variables(sb):
    assert sb.run("cd /tmp && export N=5", session="work").ok
    assert sb.run("echo $(pwd) $N", session="work").stdout == "/tmp 5\n"
    assert sb.run("echo ${N:-unset}").stdout == "unset\n"


def test_cells_keep_state_and_return_results_and_errors(sb):
    first = sb.run_code("import base64\nx = 6 * 7\nprint('hello')")
    assert (first.status, first.text, first.error) == ("ok", "hello\n", None)
    value = sb.run_code("x")
    assert value.results == [{"text/plain": "42"}]
    printed = []
    sb.run_code("for i in range(3): print(i)", on_output=printed.append)
    assert "".join(printed) == "0\n1\n2\n"
    failed = sb.run_code("1/0")
    assert failed.status == "error"
    assert failed.error.name == "ZeroDivisionError"
    assert any("ZeroDivisionError" in line for line in failed.error.traceback)
    image = sb.run_code(
        "from IPython.display import Image, display\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3]); plt.show()"
    )
    pngs = [r["image/png"] for r in image.results if "image/png" in r]
    assert pngs and pngs[0].startswith(b"\x89PNG"), image


def test_files_round_trip(sb):
    sb.files.write("dir/a.txt", "hello")
    sb.files.write("dir/b.bin", bytes(range(256)) * 5000)
    assert sb.files.read_text("dir/a.txt") == "hello"
    assert sb.files.read("dir/b.bin") == bytes(range(256)) * 5000
    listed = {f.path: f for f in sb.files.list("dir")}
    assert set(listed) == {"dir/a.txt", "dir/b.bin"}
    assert listed["dir/b.bin"].size == 256 * 5000
    assert sb.run("cat dir/a.txt").stdout == "hello"
    with pytest.raises(mentis.NotFound):
        sb.files.read("dir/missing")


def test_directories_are_made_and_files_links_and_trees_removed(sb):
    made = sb.files.mkdir("made/deep/er", mode=0o750)
    assert (made.path, made.is_dir, made.mode) == ("made/deep/er", True, 0o750)
    assert sb.run("stat -c %a made made/deep made/deep/er").stdout.split() == ["750"] * 3  # parents too
    assert sb.files.mkdir("made/deep/er").is_dir  # an existing directory is no error
    sb.files.write("made/deep/f.txt", "x")
    with pytest.raises(mentis.InvalidArgument):
        sb.files.mkdir("made/deep/f.txt")  # a file is there
    sb.files.remove("made/deep/f.txt")
    with pytest.raises(mentis.NotFound):
        sb.files.stat("made/deep/f.txt")
    with pytest.raises(mentis.FailedPrecondition):
        sb.files.remove("made")  # not empty, and not recursive
    assert sb.files.stat("made/deep/er").is_dir  # nothing went
    sb.files.remove("made", recursive=True)
    with pytest.raises(mentis.NotFound):
        sb.files.stat("made")
    with pytest.raises(mentis.NotFound):
        sb.files.remove("made")
    # An empty directory goes without `recursive`; a link goes, not what it points to.
    sb.run("mkdir empty && echo kept > target.txt && ln -s target.txt link")
    sb.files.remove("empty")
    sb.files.remove("link")
    assert sb.run("ls -d empty link 2>/dev/null; cat target.txt").stdout == "kept\n"


def test_rename_moves_files_links_and_directories_and_replaces_only_when_asked(sb):
    sb.run("mkdir -p mv/dir/inner mv/empty mv/full && echo a > mv/a.txt && echo b > mv/b.txt")
    sb.run("ln -s a.txt mv/link && touch mv/full/kept")
    moved = sb.files.rename("mv/a.txt", "mv/dir/renamed.txt")
    assert isinstance(moved, mentis.FileInfo)
    assert (moved.path, moved.is_dir, moved.size) == ("mv/dir/renamed.txt", False, 2)
    assert sb.files.read_text("mv/dir/renamed.txt") == "a\n"
    with pytest.raises(mentis.NotFound):
        sb.files.stat("mv/a.txt")

    # Something at the destination: refused, typed, and both left as they were; replaced with `overwrite`.
    with pytest.raises(mentis.AlreadyExists) as exists:
        sb.files.rename("mv/b.txt", "mv/dir/renamed.txt")
    assert exists.value.reason == "PATH_EXISTS"
    assert (sb.files.read_text("mv/b.txt"), sb.files.read_text("mv/dir/renamed.txt")) == ("b\n", "a\n")
    assert sb.files.rename("mv/b.txt", "mv/dir/renamed.txt", overwrite=True).path == "mv/dir/renamed.txt"
    assert sb.files.read_text("mv/dir/renamed.txt") == "b\n"
    assert sb.run("ls mv").stdout.split() == ["dir", "empty", "full", "link"]

    # A link moves as a link (what it points to stays); a directory with everything in it.
    link = sb.files.rename("mv/link", "mv/link2")
    assert (link.path, link.symlink_target) == ("mv/link2", "a.txt")
    tree = sb.files.rename("mv/dir", "mv/tree")
    assert (tree.path, tree.is_dir) == ("mv/tree", True)
    assert sb.files.read_text("mv/tree/renamed.txt") == "b\n" and sb.files.stat("mv/tree/inner").is_dir
    # A directory replaces only an empty one, and only with `overwrite`; it never goes into itself.
    with pytest.raises(mentis.AlreadyExists):
        sb.files.rename("mv/tree", "mv/empty")
    with pytest.raises(mentis.FailedPrecondition):
        sb.files.rename("mv/tree", "mv/full", overwrite=True)
    with pytest.raises(mentis.InvalidArgument):
        sb.files.rename("mv/tree", "mv/tree/inner/self")
    assert sb.files.rename("mv/tree", "mv/empty", overwrite=True).is_dir
    assert sb.files.read_text("mv/empty/renamed.txt") == "b\n"

    with pytest.raises(mentis.NotFound) as missing:
        sb.files.rename("mv/nothing", "mv/x")
    assert missing.value.reason == "PATH_NOT_FOUND"
    with pytest.raises(mentis.NotFound):
        sb.files.rename("mv/full/kept", "mv/no/such/dir/kept")  # the destination's parent must exist
    with pytest.raises(mentis.InvalidArgument):
        sb.files.rename("mv/full/kept", "../outside")
    # What was refused changed nothing.
    listing = sb.run("cd mv && find . -mindepth 1 | sort").stdout.split()
    assert listing == ["./empty", "./empty/inner", "./empty/renamed.txt", "./full", "./full/kept", "./link2"]


def test_list_finds_sandboxes_by_space_labels_and_state_across_pages(env):
    from mentis.v1 import space_pb2

    tag = uuid.uuid4().hex[:8]
    space = f"list-{tag}"
    made = [Sandbox.create(labels={"suite": tag, "n": str(i)}) for i in range(3)]
    try:
        request = space_pb2.CreateSpaceRequest(space=space_pb2.Space(space_id=space))
        made[0]._conn.spaces.CreateSpace(request)
        made.append(Sandbox.create(space=space, labels={"suite": tag, "n": "3"}, key=f"key-{tag}"))
        ids = [m.id for m in made]

        # Every space, oldest first, every page followed (one sandbox a page here).
        found = Sandbox.list(labels={"suite": tag}, page_size=1)
        assert [f.id for f in found] == ids
        first, last = found[0], found[3]
        assert (first.state, first.space_id, first.key) == ("running", "default", "")
        assert first.labels == {"suite": tag, "n": "0"}
        assert first.created_at is not None and first.image
        assert (last.space_id, last.key) == (space, f"key-{tag}")
        assert isinstance(first, mentis.SandboxInfo)
        with Sandbox.connect(first.id) as again:
            assert again.state == "running"
        # Filters: every label given, the space, at most `limit`.
        assert [f.id for f in Sandbox.list(labels={"suite": tag, "n": "1"})] == [ids[1]]
        assert [f.id for f in Sandbox.list(space=space, labels={"suite": tag})] == [ids[3]]
        assert [f.id for f in Sandbox.list(space="default", labels={"suite": tag})] == ids[:3]
        assert [f.id for f in Sandbox.list(labels={"suite": tag}, limit=2)] == ids[:2]
        # States: one, or several.
        made[0].pause()
        made[1].delete()
        assert [f.id for f in Sandbox.list(labels={"suite": tag}, state="paused")] == [ids[0]]
        assert [f.id for f in Sandbox.list(labels={"suite": tag}, state="running")] == [ids[2], ids[3]]
        terminated = Sandbox.list(labels={"suite": tag}, state=["terminated", "PAUSED"], page_size=1)
        assert [(f.id, f.state) for f in terminated] == [(ids[0], "paused"), (ids[1], "terminated")]
        # Mistakes: refused before any call.
        with pytest.raises(ValueError, match="sleeping"):
            Sandbox.list(state="sleeping")
        with pytest.raises(ValueError):
            Sandbox.list(limit=-1)
        with pytest.raises(mentis.InvalidArgument):
            Sandbox.list(space="Not A Space")
    finally:
        for m in made:
            m.delete()
            m.close()


def test_a_dropped_stream_is_resumed_and_every_byte_arrives_once(sb):
    # The client closes its own channel while the command prints; the SDK reconnects and resumes after
    # the last seq it received.
    lines = []
    dropped = threading.Event()

    def on_stdout(text):
        lines.append(text)
        if not dropped.is_set() and "5\n" in "".join(lines):
            dropped.set()
            sb._conn._raw.close()

    r = sb.run("for i in $(seq 1 40); do echo $i; sleep 0.05; done", on_stdout=on_stdout)
    assert dropped.is_set()
    assert r.exit_code == 0
    expected = "".join(f"{i}\n" for i in range(1, 41))
    assert r.stdout == expected
    assert "".join(lines) == expected


def test_pause_resume_and_get_or_create(runtime):
    key = f"conv-{time.time_ns()}"
    first = Sandbox.get_or_create(key=key, addr=runtime.addr, api_key=runtime.key)
    again = Sandbox.get_or_create(key=key, addr=runtime.addr, api_key=runtime.key)
    try:
        assert first.id == again.id
        assert first.pause().state == "paused"
        assert first.resume().state == "running"
        assert first.run("echo back").stdout == "back\n"
    finally:
        first.delete()
        first.close()
        again.close()
    # A deleted sandbox's record stays, final.
    assert Sandbox.connect(first.id, addr=runtime.addr, api_key=runtime.key).state == "terminated"


def test_a_block_deletes_what_it_created_unless_kept(env):
    with Sandbox.create() as made:
        made_id = made.id
    assert Sandbox.connect(made_id).state == "terminated"
    with Sandbox.create(keep=True) as kept:
        kept_id = kept.id
    again = Sandbox.connect(kept_id)
    assert again.run("true").ok
    again.delete()


def test_mistakes_are_typed_errors_with_the_runtimes_details(env, monkeypatch):
    with pytest.raises(mentis.InvalidArgument) as bad:
        Sandbox.create(memory_mb=-5)
    assert bad.value.reason and bad.value.field, bad.value
    with pytest.raises(mentis.NotFound) as missing:
        Sandbox.connect(str(uuid.uuid4()))
    assert missing.value.reason == "SANDBOX_NOT_FOUND"
    with pytest.raises(mentis.InvalidArgument):
        Sandbox.connect("not-a-sandbox-id")
    monkeypatch.setenv("MENTIS_API_KEY", "mk_wrong")
    with pytest.raises(mentis.Unauthenticated):
        Sandbox.create()
    # No address: embedded mode, which needs a runtime binary to start.
    monkeypatch.delenv("MENTIS_ADDR")
    monkeypatch.setenv("MENTIS_RUNTIME_BIN", "/nonexistent/mentis-runtime")
    with pytest.raises(mentis.ConfigError):
        Sandbox.create()


def _python_blocks(doc: str, marker: str = "") -> list[str]:
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[3] / doc).read_text()
    if marker:
        text = text.split(f"<!-- {marker}:begin -->", 1)[1].split(f"<!-- {marker}:end -->", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, f"no python block in {doc} {marker}"
    return blocks


def test_the_guides_examples_run_as_written(env, capsys):
    # docs/SDK.md's and the README's Python blocks, exactly as a reader would paste them.
    sync, asynchronous = _python_blocks("docs/SDK.md")[:2]  # later sections' blocks run in their own tests
    exec(compile(sync, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["3 hi", "", "42", "hello ['notes/a.txt']"]
    exec(compile(asynchronous, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["hi 42"]
    (readme,) = _python_blocks("README.md", "sdk")
    exec(compile(readme, "README.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["3", "42"]


def test_the_guides_list_example_runs_as_written(env, capsys):
    (block,) = _python_blocks("docs/SDK.md", "list")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["True running {'team': 'docs'}"]


def test_a_network_drop_is_resumed_and_every_byte_arrives_once(runtime, proxy):
    # Through a proxy that resets every connection mid-command: the SDK reconnects (through the proxy again)
    # and resumes after the last seq it received.
    with Sandbox.create(addr=proxy.addr, api_key=runtime.key) as sb:
        seen = []

        def on_stdout(text):
            seen.append(text)
            if proxy.cuts == 0 and "10\n" in "".join(seen):
                proxy.cut()

        r = sb.run("for i in $(seq 1 60); do echo $i; sleep 0.03; done", on_stdout=on_stdout)
        expected = "".join(f"{i}\n" for i in range(1, 61))
        assert proxy.cuts == 1
        assert (r.exit_code, r.stdout, "".join(seen)) == (0, expected, expected)


def test_embedded_mode_starts_a_runtime_for_the_process_and_cleans_up_at_exit(runtime, tmp_path):
    # A fresh process with no address: the SDK starts MENTIS_RUNTIME_BIN on a free port with its own data
    # folder, runs the cell, and at exit deletes its sandboxes and stops the runtime.
    import os
    import subprocess
    import sys

    env = {
        k: v for k, v in os.environ.items() if k not in ("MENTIS_ADDR", "MENTIS_API_KEY", "MENTIS_DATA_DIR")
    }
    script = (
        "import mentis._embedded as e\n"
        "from mentis import Sandbox\n"
        "sb = Sandbox.create()\n"  # not deleted by the script: the exit must do it
        "print(sb.run_code('6 * 7').results[0]['text/plain'])\n"
        "print(e._runtime.instance, e._runtime.proc.pid, e._runtime.data)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    answer, started = out.stdout.splitlines()
    instance, pid, data = started.split()
    assert answer == "42"
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.mentis.instance={instance}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert left == [], f"containers of {instance} left behind"
    assert not os.path.exists(f"/proc/{pid}"), "the embedded runtime still runs"
    assert not os.path.exists(data)


def test_the_guides_embedded_example_runs_as_written(runtime, tmp_path):
    # docs/SDK.md's embedded-mode one-liner, with the environment it asks for (no address, no key).
    import os
    import pathlib
    import re
    import subprocess
    import sys

    guide = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "SDK.md").read_text()
    section = guide.split("## Embedded mode", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"python -c '(.*?)'", section)
    assert code, "no python -c line in the guide's embedded-mode section"
    unset = ("MENTIS_ADDR", "MENTIS_API_KEY", "MENTIS_DATA_DIR", "MENTIS_RUNTIME_BIN")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (out.returncode, out.stdout) == (0, "embedded\n\n"), out.stderr


def test_a_refused_create_connect_or_get_or_create_closes_its_channel(runtime, monkeypatch):
    closed = []
    connection = mentis._client.Connection
    original = connection.close
    monkeypatch.setattr(connection, "close", lambda self: closed.append(self) or original(self))
    with pytest.raises(mentis.InvalidArgument):
        Sandbox.create(image="../../etc", addr=runtime.addr, api_key=runtime.key)
    with pytest.raises(mentis.NotFound):
        Sandbox.connect(str(uuid.uuid4()), addr=runtime.addr, api_key=runtime.key)
    with pytest.raises(mentis.InvalidArgument):
        Sandbox.get_or_create(key="k", space="Not A Space", addr=runtime.addr, api_key=runtime.key)
    assert len(closed) == 3, closed
