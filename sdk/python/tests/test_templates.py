"""Templates and images of your own (TemplateService, `Sandbox.create(template=...)`) with both APIs, against
a real runtime, real sandboxes and the real engine: create, get, list across pages, update by mask, delete; a
sandbox made from a template with its image, env, limits, working directory and start-up commands; images
built from a local folder (the engine's output streamed back) and imported from a root filesystem tar; the
typed errors. Images are made on the test images of tests/images/build.sh, and every image a test builds or
imports is removed at its end, whether it passed or not."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import pathlib
import subprocess
import uuid
from datetime import datetime

import pytest
from mentis.v1 import space_pb2

import mentis
import mentis.aio
import mentis.template
from mentis import AsyncSandbox, AsyncTemplates, BuiltImage, Sandbox, Template, Templates

REPO = pathlib.Path(__file__).resolve().parents[3]
BUSYBOX = "mentis-test/busybox:1"
# The container's cgroup (v2, or v1's controllers): its memory limit in bytes, then its pids limit.
LIMITS = (
    "cd /sys/fs/cgroup; cat memory.max 2>/dev/null || cat memory/memory.limit_in_bytes; "
    "cat pids.max 2>/dev/null || cat pids/pids.max"
)


def _docker(*args: str) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr.strip()}"
    return r.stdout


def _inspect(image: str, format: str) -> str:
    return _docker("image", "inspect", "--format", format, image).strip()


@pytest.fixture(scope="session")
def busybox() -> str:
    """The busybox test image, made by tests/images/build.sh with the other images of the "any image" tests
    (once, then cached by the script)."""
    script = REPO / "tests" / "images" / "build.sh"
    r = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.fail(f"{script} failed ({r.returncode}): {r.stderr.strip()[-3000:]}")
    assert BUSYBOX in r.stdout.split(), r.stdout
    return BUSYBOX


@pytest.fixture
def images(runtime):
    """Names for the images a test builds or imports, each removed from the engine at the test's end."""
    made: list[str] = []

    def name(what: str) -> str:
        image = f"mentis-test/sdk-{what}-{runtime.instance}-{uuid.uuid4().hex[:6]}:1"
        made.append(image)
        return image

    yield name
    if made:
        subprocess.run(["docker", "image", "rm", "-f", *made], capture_output=True, check=False)


@pytest.fixture
def templates(env):
    with Templates() as t:
        yield t


def _ms(t: datetime | None) -> datetime | None:
    return None if t is None else t.replace(microsecond=t.microsecond // 1000 * 1000)


def _same(a: Template, b: Template) -> bool:
    """The same template; times to the millisecond (what the runtime stores: CreateTemplate's and
    UpdateTemplate's answers carry the clock's microseconds, later reads the stored milliseconds)."""
    return dataclasses.replace(a, created_at=_ms(a.created_at), updated_at=_ms(a.updated_at)) == (
        dataclasses.replace(b, created_at=_ms(b.created_at), updated_at=_ms(b.updated_at))
    )


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _context(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """A build context folder of `files` (path: content)."""
    folder = tmp_path / f"context-{uuid.uuid4().hex[:6]}"
    for path, content in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(content)
    return folder


def test_templates_are_created_got_listed_across_pages_updated_by_mask_and_deleted(env, templates, busybox):
    # A space of this test's own, so that the listing holds its templates only.
    space = _name("tpl")
    templates._conn.spaces.CreateSpace(space_pb2.CreateSpaceRequest(space=space_pb2.Space(space_id=space)))
    made = templates.create(
        "busy",
        space_id=space,
        image=BUSYBOX,
        description="busybox with an app folder",
        env={"GREETING": "hello", "MODE": "dev"},
        cpu=0.5,
        memory_mb=160,
        pids=80,
        nofile=512,
        work_dir="app",
        setup_commands=["mkdir -p app", "echo ready > app/marker"],
        pool_size=1,
    )
    assert isinstance(made, Template)
    assert (made.name, made.space_id, made.description, made.image) == (
        "busy",
        space,
        "busybox with an app folder",
        BUSYBOX,
    )
    assert (made.cpu, made.memory_mb, made.pids, made.nofile, made.disk_mb) == (0.5, 160, 80, 512, 0)
    assert made.env == {"GREETING": "hello", "MODE": "dev"}
    assert made.setup_commands == ["mkdir -p app", "echo ready > app/marker"]
    assert (made.work_dir, made.pool_size) == ("app", 1)
    assert made.created_at is not None and made.created_at.tzinfo is not None
    assert made.updated_at == made.created_at
    assert _same(templates.get("busy", space), made)

    # More, and a listing in name order across pages of two and of one.
    for name in ("c-three", "a-one", "b-two"):
        templates.create(name, space_id=space)
    names = ["a-one", "b-two", "busy", "c-three"]
    assert [t.name for t in templates.list(space)] == names
    assert [t.name for t in templates.list(space, page_size=2)] == names
    assert [t.name for t in templates.list(space_id=space, page_size=1)] == names
    assert _same(templates.list(space)[2], made)
    assert all(t.space_id == space for t in templates.list(space))

    # Only the fields given change: a limit given keeps the other limits; the rest stays as it was.
    changed = templates.update("busy", space_id=space, description="changed", memory_mb=256)
    assert (changed.description, changed.memory_mb) == ("changed", 256)
    assert (changed.cpu, changed.pids, changed.nofile) == (0.5, 80, 512)
    assert (changed.image, changed.env, changed.work_dir, changed.pool_size) == (BUSYBOX, made.env, "app", 1)
    assert changed.setup_commands == made.setup_commands
    assert _ms(changed.created_at) == _ms(made.created_at) and changed.updated_at > made.updated_at
    changed = templates.update("busy", space_id=space, env={"ONLY": "this"}, setup_commands=None, pool_size=0)
    assert (changed.env, changed.setup_commands, changed.pool_size) == ({"ONLY": "this"}, [], 0)
    assert (changed.description, changed.memory_mb, changed.work_dir) == ("changed", 256, "app")
    # All five limits given: no read first, and each as given.
    changed = templates.update("busy", space_id=space, cpu=0, memory_mb=0, pids=0, nofile=0, disk_mb=0)
    assert (changed.cpu, changed.memory_mb, changed.pids, changed.nofile, changed.disk_mb) == (0, 0, 0, 0, 0)
    assert _same(templates.get("busy", space), changed)

    with pytest.raises(TypeError):
        templates.update("busy", space_id=space, colour="blue")
    with pytest.raises(ValueError):
        templates.update("busy", space_id=space)
    with pytest.raises(mentis.NotFound):
        templates.update("missing", space_id=space, description="x")
    with pytest.raises(mentis.NotFound):
        templates.update("missing", space_id=space, memory_mb=1)  # the read first says so
    with pytest.raises(mentis.AlreadyExists):
        templates.create("busy", space_id=space)
    with pytest.raises(mentis.InvalidArgument) as bad:
        templates.create("Not_A_Name", space_id=space)
    assert bad.value.field == "template.name", bad.value
    with pytest.raises(mentis.InvalidArgument) as bad:
        templates.create(_name("neg"), memory_mb=-1)
    assert bad.value.field == "template.limits", bad.value
    # A runtime class the runtime does not offer (this one offers none: MENTIS_RUNTIME_CLASSES).
    with pytest.raises(mentis.InvalidArgument) as bad:
        templates.create(_name("iso"), runtime_class="runsc")
    assert bad.value.field == "template.runtime_class", bad.value
    assert "offers none" in str(bad.value), bad.value
    with pytest.raises(mentis.NotFound) as no_space:
        templates.create("any", space_id=_name("nowhere"))
    assert no_space.value.reason == "SPACE_NOT_FOUND", no_space.value

    for name in names:
        templates.delete(name, space)
    assert templates.list(space) == []
    with pytest.raises(mentis.NotFound):
        templates.get("busy", space)
    with pytest.raises(mentis.NotFound):
        templates.delete("busy", space)
    templates._conn.spaces.DeleteSpace(space_pb2.DeleteSpaceRequest(space_id=space, force=True))

    # No space_id: the space "default".
    name = _name("plain")
    assert templates.create(name).space_id == "default"
    assert name in [t.name for t in templates.list()]
    assert _same(templates.get(name), templates.get(name, "default"))
    templates.delete(name)


def test_a_sandbox_made_from_a_template_has_its_image_env_limits_work_dir_and_start_up_commands(
    env, templates, busybox
):
    name = _name("busy")
    templates.create(
        name,
        image=BUSYBOX,
        env={"GREETING": "hello", "SHARED": "from the template"},
        memory_mb=160,
        pids=80,
        work_dir="app",
        setup_commands=["mkdir -p app && echo ready > app/marker", 'echo "$GREETING" > app/greeting'],
    )
    with Sandbox.create(template=name, env={"SHARED": "from the spec"}) as sb:
        assert (sb.template, sb.work_dir, sb.runtime_class) == (name, "app", "")
        # The start-up commands ran before create returned, with the env; a command starts in work_dir.
        r = sb.run('pwd; cat marker greeting; echo "$SHARED"; readlink /proc/$$/exe')
        assert r.stdout == "/workspace/app\nready\nhello\nfrom the spec\n/bin/busybox\n", r
        assert sb.run(LIMITS).stdout == f"{160 * 1024 * 1024}\n80\n"
        # A command that names its directory keeps it.
        assert sb.run("pwd", cwd="/tmp").stdout == "/tmp\n"
        assert sb.files.read_text("app/marker") == "ready\n"
        assert sb.refresh().template == name
    # A spec's own limits win over the template's.
    with Sandbox.create(template=name, memory_mb=200) as own:
        assert own.run(LIMITS).stdout == f"{200 * 1024 * 1024}\n80\n"

    # get_or_create makes it from the template too.
    key = _name("key")
    kept = Sandbox.get_or_create(key=key, template=name)
    try:
        assert (kept.template, kept.run("pwd").stdout) == (name, "/workspace/app\n")
        again = Sandbox.get_or_create(key=key, template=name)
        assert again.id == kept.id
        again.close()
    finally:
        kept.delete()
        kept.close()

    # A template that is not there makes nothing; a start-up command that fails fails the create.
    with pytest.raises(mentis.NotFound):
        Sandbox.create(template=_name("missing"))
    failing = _name("failing")
    templates.create(failing, image=BUSYBOX, setup_commands=["echo preparing; exit 7"])
    with pytest.raises(mentis.FailedPrecondition) as failed:
        Sandbox.create(template=failing)
    assert "exited with 7" in failed.value.message and "preparing" in failed.value.message, failed.value
    # A template that goes later leaves its sandboxes as they are.
    with Sandbox.create(template=name) as sb:
        templates.delete(name)
        assert sb.run("cat marker").stdout == "ready\n"
        assert sb.refresh().template == name
    templates.delete(failing)


def test_an_image_built_from_a_local_folder_makes_sandboxes_and_its_output_streams_back(
    env, templates, images, busybox, tmp_path
):
    dockerfile = (
        f"FROM {BUSYBOX}\nCOPY hello.txt /srv/hello.txt\nCOPY data /srv/data\n"
        "RUN echo built by the engine > /srv/built.txt\nENV BUILT=yes\n"
    )
    custom = f'FROM {BUSYBOX}\nARG GREETING\nRUN mkdir -p /srv && echo "$GREETING" > /srv/arg.txt\n'
    folder = _context(
        tmp_path,
        {
            "Dockerfile": dockerfile,
            "hello.txt": "hello from the context\n",
            "data/nested/deep.txt": "deep\n",
            "build/Custom.Dockerfile": custom,
        },
    )
    # 3 MB: the context goes in several chunks.
    (folder / "data" / "blob.bin").write_bytes(bytes(range(256)) * 12_000)
    tag = images("built")
    output: list[str] = []
    built = templates.build_image(folder, tag, on_output=output.append)
    assert isinstance(built, BuiltImage)
    assert built.image == tag and built.image_id.startswith("sha256:"), built
    assert _inspect(tag, "{{.Id}}") == built.image_id
    assert output and all(isinstance(text, str) for text in output)
    text = "".join(output)
    assert f": FROM {BUSYBOX}" in text and "COPY hello.txt /srv/hello.txt" in text, text

    # A template of it, and the image named directly.
    name = _name("built")
    templates.create(name, image=built.image)
    with Sandbox.create(template=name) as sb:
        r = sb.run("cd /srv; cat hello.txt built.txt data/nested/deep.txt; echo $BUILT; wc -c <data/blob.bin")
        assert r.stdout == "hello from the context\nbuilt by the engine\ndeep\nyes\n3072000\n", r
    templates.delete(name)

    # Another Dockerfile of the folder, with an ARG, built again from scratch.
    other = images("args")
    seen: list[str] = []
    rebuilt = templates.build_image(
        str(folder),
        other,
        dockerfile="build/Custom.Dockerfile",
        build_args={"GREETING": "from a build arg"},
        no_cache=True,
        on_output=seen.append,
    )
    assert rebuilt.image == other and rebuilt.image_id != built.image_id
    assert "Using cache" not in "".join(seen)
    with Sandbox.create(image=other) as sb:
        assert sb.run("cat /srv/arg.txt").stdout == "from a build arg\n"


def test_a_build_that_cannot_be_done_raises_the_typed_error_and_local_mistakes_raise_here(
    env, templates, images, busybox, tmp_path
):
    missing = _context(tmp_path, {"Dockerfile": "FROM mentis-test/not-here:1\nRUN true\n"})
    tag = images("never")
    output: list[str] = []
    with pytest.raises(mentis.FailedPrecondition) as no_base:
        templates.build_image(missing, tag, on_output=output.append)
    assert 'FROM "mentis-test/not-here:1" names an image this engine does not have' in no_base.value.message
    assert output == []  # refused before the build

    # A step that fails: its output first, then the error.
    failing = _context(tmp_path, {"Dockerfile": f"FROM {BUSYBOX}\nRUN echo trying; exit 3\n"})
    with pytest.raises(mentis.FailedPrecondition) as failed:
        templates.build_image(failing, tag, on_output=output.append)
    assert "returned a non-zero code: 3" in failed.value.message, failed.value
    assert "trying" in "".join(output)
    # A callback that raises ends the call, and its error is raised. (The runtime's build goes on; this one
    # fails at its end, so that no image is tagged after the test removed its images.)
    with pytest.raises(KeyError):
        templates.build_image(failing, tag, on_output=_refuse)
    plain = _context(tmp_path, {"Dockerfile": f"FROM {BUSYBOX}\n"})

    with pytest.raises(FileNotFoundError):
        templates.build_image(tmp_path / "nowhere", tag)
    with pytest.raises(NotADirectoryError):
        templates.build_image(missing / "Dockerfile", tag)
    with pytest.raises(mentis.InvalidArgument) as bad:
        templates.build_image(plain, "Not A Tag")
    assert bad.value.field == "header.image", bad.value
    with pytest.raises(FileNotFoundError):
        templates.import_image(tmp_path / "nowhere.tar", tag)
    with pytest.raises(IsADirectoryError):
        templates.import_image(tmp_path, tag)

    # Images are the engine's: a key of a space may neither build nor import them.
    from mentis.v1 import key_pb2, key_pb2_grpc

    keys = key_pb2_grpc.KeyServiceStub(templates._conn._channel)
    secret = keys.CreateApiKey(key_pb2.CreateApiKeyRequest(name="default only", space_ids=["default"])).secret
    with Templates(api_key=secret) as theirs:
        with pytest.raises(mentis.PermissionDenied):
            theirs.build_image(plain, tag)
        with pytest.raises(mentis.PermissionDenied):
            theirs.import_image(b"not even a tar", tag)


def test_a_context_that_cannot_be_read_cancels_the_build_and_its_error_is_raised(
    env, templates, images, busybox, tmp_path, monkeypatch
):
    # The archive breaks after its first chunk (a file unreadable mid-way): the call is cancelled rather than
    # ended cleanly, so the runtime builds nothing of the half it got, and the local error is what is raised.
    folder = _context(tmp_path, {"Dockerfile": f"FROM {BUSYBOX}\n", "big.bin": "x" * 3_000_000})
    whole = mentis.template._context_chunks

    def breaking(context):
        chunks = whole(context)
        yield next(chunks)
        raise OSError("the disk went away")

    monkeypatch.setattr(mentis.template, "_context_chunks", breaking)
    monkeypatch.setattr(mentis.aio, "_context_chunks", breaking)
    tag = images("broken")
    with pytest.raises(OSError, match="the disk went away"):
        templates.build_image(folder, tag)

    async def main():
        async with AsyncTemplates() as asynchronous:
            with pytest.raises(OSError, match="the disk went away"):
                await asynchronous.build_image(folder, tag)

    asyncio.run(main())
    r = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    assert r.returncode != 0, "an image was built of half a context"


def _refuse(text: str) -> None:
    raise KeyError(f"the callback refuses {text!r}")


@pytest.fixture
def busybox_rootfs(busybox, tmp_path):
    """busybox's root filesystem as a tar, from `docker export` of a container of the test image."""
    container = _docker("create", BUSYBOX).strip()
    try:
        tar = tmp_path / "rootfs.tar"
        _docker("export", "-o", str(tar), container)
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    return tar


def test_an_image_imported_from_a_root_filesystem_tar_makes_sandboxes(env, templates, images, busybox_rootfs):
    tag = images("imported")
    imported = templates.import_image(busybox_rootfs, tag, changes=["ENV PATH=/bin", "LABEL origin=tarball"])
    assert isinstance(imported, BuiltImage)
    assert imported.image == tag and imported.image_id.startswith("sha256:"), imported
    assert _inspect(tag, '{{index .Config.Labels "origin"}}') == "tarball"
    with Sandbox.create(image=tag) as sb:
        assert sb.run("echo imported; readlink /proc/$$/exe").stdout == "imported\n/bin/busybox\n"

    # The same as gzip bytes, and from an open file.
    from_bytes = templates.import_image(gzip.compress(busybox_rootfs.read_bytes()), images("gz"))
    assert _inspect(from_bytes.image, "{{.Id}}") == from_bytes.image_id
    with busybox_rootfs.open("rb") as f:
        from_file = templates.import_image(f, images("file"), changes=["WORKDIR /srv"])
    assert _inspect(from_file.image, "{{.Config.WorkingDir}}") == "/srv"

    # It belongs to its space (default): a key of another space may not use it until the admin shares it.
    assert (imported.space_id, imported.shared) == ("default", False), imported
    from mentis.v1 import key_pb2, key_pb2_grpc, space_pb2

    channel = templates._conn._channel
    other = _name("images")
    templates._conn.spaces.CreateSpace(space_pb2.CreateSpaceRequest(space=space_pb2.Space(space_id=other)))
    try:
        keys = key_pb2_grpc.KeyServiceStub(channel)
        secret = keys.CreateApiKey(key_pb2.CreateApiKeyRequest(name="other space", space_ids=[other])).secret
        with pytest.raises(mentis.PermissionDenied) as not_theirs:
            Sandbox.create(image=tag, space=other, api_key=secret)
        assert not_theirs.value.reason == "IMAGE_NOT_ALLOWED", not_theirs.value
        assert templates.share_image(tag).shared is True
        with Sandbox.create(image=tag, space=other, api_key=secret) as sb:
            assert sb.run("echo shared").stdout == "shared\n"
        unshared = templates.share_image(tag, shared=False)
        assert (unshared.image_id, unshared.space_id, unshared.shared) == (
            imported.image_id,
            "default",
            False,
        )
        with pytest.raises(mentis.PermissionDenied):
            Sandbox.create(image=tag, space=other, api_key=secret)
    finally:
        templates._conn.spaces.DeleteSpace(space_pb2.DeleteSpaceRequest(space_id=other, force=True))

    # What is not a root filesystem is refused, and nothing is made of it.
    refused = images("refused")
    with pytest.raises(mentis.MentisError):
        templates.import_image(b"", refused)
    with pytest.raises(mentis.InvalidArgument):
        templates.import_image(busybox_rootfs, refused, changes=["RUN rm -rf /"])


def test_the_async_api_creates_builds_imports_and_makes_sandboxes(env, images, busybox, tmp_path):
    dockerfile = f"FROM {BUSYBOX}\nCOPY note.txt /srv/note.txt\n"
    folder = _context(tmp_path, {"Dockerfile": dockerfile, "note.txt": "async build\n"})
    tag = images("async")
    rootfs = images("async-rootfs")
    name = _name("async")

    async def main():
        async with AsyncTemplates() as templates:
            output: list[str] = []
            built = await templates.build_image(folder, tag, on_output=output.append)
            assert built.image == tag and built.image_id.startswith("sha256:"), built
            assert f": FROM {BUSYBOX}" in "".join(output)
            made = await templates.create(
                name,
                image=built.image,
                env={"WHERE": "async"},
                pids=70,
                work_dir="/srv",
                setup_commands=["echo $WHERE > /tmp/setup"],
            )
            assert _same(await templates.get(name), made)
            assert name in [t.name for t in await templates.list(page_size=1)]
            changed = await templates.update(name, memory_mb=150)
            assert (changed.memory_mb, changed.pids, changed.env) == (150, 70, {"WHERE": "async"})
            async with AsyncSandbox.create(template=name) as sb:
                assert (sb.template, sb.work_dir) == (name, "/srv")
                r = await sb.run("pwd; cat note.txt /tmp/setup")
                assert r.stdout == "/srv\nasync build\nasync\n", r
                assert (await sb.run(LIMITS)).stdout == f"{150 * 1024 * 1024}\n70\n"
            await templates.delete(name)
            with pytest.raises(mentis.NotFound):
                await templates.get(name)

            missing = _context(tmp_path, {"Dockerfile": "FROM mentis-test/not-here:1\n"})
            with pytest.raises(mentis.FailedPrecondition):
                await templates.build_image(missing, images("never"))
            failing = _context(tmp_path, {"Dockerfile": f"FROM {BUSYBOX}\nRUN echo async trying; exit 4\n"})
            seen: list[str] = []
            with pytest.raises(mentis.FailedPrecondition) as failed:
                await templates.build_image(failing, images("never"), on_output=seen.append)
            assert "returned a non-zero code: 4" in failed.value.message
            assert "async trying" in "".join(seen)
            with pytest.raises(KeyError):
                await templates.build_image(failing, images("never"), on_output=_refuse)
            with pytest.raises(FileNotFoundError):
                await templates.build_image(tmp_path / "nowhere", tag)

            container = _docker("create", BUSYBOX).strip()
            try:
                tar = _docker_export(container)
            finally:
                subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
            imported = await templates.import_image(tar, rootfs, changes=["ENV PATH=/bin"])
            assert imported.image == rootfs and imported.image_id.startswith("sha256:")
            async with AsyncSandbox.create(image=rootfs) as sb:
                assert (await sb.run("echo from the import")).stdout == "from the import\n"

    asyncio.run(main())


def _docker_export(container: str) -> bytes:
    r = subprocess.run(["docker", "export", container], capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_guides_template_example_runs_as_written(env, images, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "templates")
    try:
        exec(compile(block, "docs/SDK.md", "exec"), {})
    finally:
        subprocess.run(["docker", "image", "rm", "-f", "my-team/tools:1"], capture_output=True, check=False)
    out = capsys.readouterr().out.splitlines()
    assert "Step 1/" in out[0] and "Successfully tagged my-team/tools:1" in out, out
    assert out[out.index("Successfully tagged my-team/tools:1") + 1 :] == [
        "/workspace/app",
        "hello from my image",
        "dev",
    ], out
