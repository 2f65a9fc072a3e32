"""Snapshots (SnapshotService, `Sandbox.create(snapshot_id=...)`) with both APIs, against a real runtime and
real sandboxes: a workspace taken, its sandbox deleted, brought back byte for byte in a new one; listing by
labels, sandbox and space across pages; get; delete; the typed errors."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

import mentis
from mentis import AsyncSandbox, AsyncSnapshots, Sandbox, Snapshots


@pytest.fixture
def snapshots(env):
    with Snapshots() as s:
        yield s


def test_a_workspace_comes_back_in_a_new_sandbox_after_its_sandbox_is_deleted(env, snapshots):
    blob = os.urandom(300_000)
    conversation = f"chat-{uuid.uuid4().hex[:8]}"
    with Sandbox.create() as sb:
        sb.files.write("notes/blob.bin", blob)
        sb.files.write("run.sh", "#!/bin/sh\necho run\n", mode=0o750)
        assert sb.run("ln -s notes/blob.bin link && mkdir -p empty/inner").ok
        snap = sb.snapshot(labels={"conversation": conversation})
        taken_from = sb.id
    assert Sandbox.connect(taken_from).state == "terminated"

    assert (snap.sandbox_id, snap.space_id, snap.labels) == (
        taken_from,
        "default",
        {"conversation": conversation},
    )
    assert snap.store == "local"
    assert len(snap.sha256) == 64 and int(snap.sha256, 16) >= 0
    assert snap.archive_bytes > len(blob) and snap.size_bytes > 0
    assert snap.created_at is not None and snap.created_at.tzinfo is not None
    uuid.UUID(snap.id)
    assert snapshots.get(snap.id) == snap

    with Sandbox.create(snapshot_id=snap.id) as again:
        assert again.id != taken_from
        assert again.files.read("notes/blob.bin") == blob
        assert again.files.stat("run.sh").mode & 0o777 == 0o750
        assert again.run("./run.sh").stdout == "run\n"
        assert again.files.stat("link").symlink_target == "notes/blob.bin"
        assert again.files.stat("empty/inner").is_dir
        assert again.run("sha256sum < link").stdout.split()[0] == _sha256(blob)
    # get_or_create restores it when it creates the sandbox.
    key = f"conv-{uuid.uuid4().hex[:8]}"
    kept = Sandbox.get_or_create(key=key, snapshot_id=snap.id)
    try:
        assert kept.files.read("notes/blob.bin") == blob
    finally:
        kept.delete()
        kept.close()
    snapshots.delete(snap.id)


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_list_filters_by_labels_sandbox_and_space_newest_first_across_pages(env, snapshots):
    run = uuid.uuid4().hex[:8]
    with Sandbox.create() as sb, Sandbox.create() as other:
        taken = [sb.snapshot(labels={"run": run, "i": str(i)}) for i in range(5)]
        elsewhere = other.snapshot(labels={"run": run, "i": "other"})
        unlabelled = sb.snapshot()
    newest_first = [s.id for s in reversed([*taken, elsewhere])]

    assert [s.id for s in snapshots.list(labels={"run": run})] == newest_first
    # Two a page: three pages, followed to the end, in the same order.
    assert [s.id for s in snapshots.list(labels={"run": run}, page_size=2)] == newest_first
    assert [s.id for s in snapshots.list(labels={"run": run}, page_size=1)] == newest_first
    # limit: the latest only (one page of one), or the first few across pages.
    assert [s.id for s in snapshots.list(labels={"run": run}, limit=1)] == newest_first[:1]
    assert [s.id for s in snapshots.list(labels={"run": run}, page_size=2, limit=3)] == newest_first[:3]
    # Every label must match.
    assert [s.id for s in snapshots.list(labels={"run": run, "i": "3"})] == [taken[3].id]
    assert snapshots.list(labels={"run": run, "i": "none"}) == []
    # By sandbox: that sandbox's only (the unlabelled one too), whatever the labels.
    assert [s.id for s in snapshots.list(sandbox_id=sb.id)] == [
        unlabelled.id,
        *[s.id for s in reversed(taken)],
    ]
    assert [s.id for s in snapshots.list(sandbox_id=other.id)] == [elsewhere.id]
    # By space.
    assert [s.id for s in snapshots.list(space="default", labels={"run": run})] == newest_first
    # What a list returns is what get returns.
    assert snapshots.list(labels={"run": run, "i": "3"})[0] == snapshots.get(taken[3].id)

    with pytest.raises(mentis.InvalidArgument) as bad:
        snapshots.list(page_size=-1)
    assert bad.value.field == "page_size", bad.value
    with pytest.raises(ValueError):
        snapshots.list(limit=-1)
    for s in [*taken, elsewhere, unlabelled]:
        snapshots.delete(s.id)
    assert snapshots.list(labels={"run": run}) == []


def test_delete_is_idempotent_and_a_missing_snapshot_is_not_found(env, snapshots):
    with Sandbox.create() as sb:
        snap = sb.snapshot()
    snapshots.delete(snap.id)
    with pytest.raises(mentis.NotFound) as gone:
        snapshots.get(snap.id)
    assert gone.value.reason == "SNAPSHOT_NOT_FOUND", gone.value
    snapshots.delete(snap.id)  # again: no error
    snapshots.delete(str(uuid.uuid4()))

    # Restoring one that is not there creates nothing.
    with pytest.raises(mentis.NotFound) as missing:
        Sandbox.create(snapshot_id=snap.id)
    assert missing.value.reason == "SNAPSHOT_NOT_FOUND", missing.value
    with pytest.raises(mentis.InvalidArgument) as bad:
        snapshots.get("not-a-snapshot-id")
    assert bad.value.field == "snapshot_id", bad.value
    # A sandbox that no longer runs cannot be snapshotted.
    with pytest.raises(mentis.MentisError):
        Sandbox.connect(sb.id).snapshot()


def test_the_async_api_snapshots_restores_lists_and_deletes(env):
    label = uuid.uuid4().hex[:8]

    async def main():
        async with AsyncSandbox.create() as sb:
            await sb.files.write("state.txt", "async kept")
            first = await sb.snapshot(labels={"async": label})
            await sb.files.write("state.txt", "async changed")
            second = await sb.snapshot(labels={"async": label})
        async with AsyncSnapshots() as snapshots:
            assert await snapshots.get(first.id) == first
            listed = await snapshots.list(labels={"async": label}, page_size=1)
            assert [s.id for s in listed] == [second.id, first.id]
            assert [s.id for s in await snapshots.list(labels={"async": label}, limit=1)] == [second.id]
            async with AsyncSandbox.create(snapshot_id=first.id) as again:
                assert await again.files.read_text("state.txt") == "async kept"
                third = await snapshots.create(again.id, labels={"async": label, "from": "restored"})
            assert (third.sandbox_id, third.labels["from"]) == (again.id, "restored")
            assert [s.id for s in await snapshots.list(sandbox_id=again.id)] == [third.id]
            for s in (first, second, third):
                await snapshots.delete(s.id)
            await snapshots.delete(first.id)  # idempotent
            assert await snapshots.list(labels={"async": label}) == []
            with pytest.raises(mentis.NotFound) as missing:
                await snapshots.get(first.id)
            assert missing.value.reason == "SNAPSHOT_NOT_FOUND"
            with pytest.raises(mentis.NotFound):
                await AsyncSandbox.create(snapshot_id=first.id)

    asyncio.run(main())


def test_the_guides_snapshot_example_runs_as_written(env, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "snapshots")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["kept from the first sandbox", "True", "[]"]
