"""The asyncio API against a real runtime and real sandboxes (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from mentis.v1 import space_pb2

import mentis
from mentis import AsyncSandbox, AsyncSecrets, EgressRule


def test_the_async_api_runs_commands_cells_and_files(env):
    tag = uuid.uuid4().hex[:8]

    async def main():
        async with AsyncSandbox.create(labels={"suite": tag}) as sb:
            live = []
            r = await sb.run("echo out; echo err >&2; exit 4", on_stdout=live.append)
            assert (r.exit_code, r.stdout, r.stderr, "".join(live)) == (4, "out\n", "err\n", "out\n")
            assert (await sb.run("cd /tmp", session="a")).ok
            assert (await sb.run("pwd", session="a")).stdout == "/tmp\n"
            cell = await sb.run_code("y = 40 + 2\ny")
            assert cell.results == [{"text/plain": "42"}]
            failed = await sb.run_code("raise KeyError('k')")
            assert (failed.status, failed.error.name) == ("error", "KeyError")
            await sb.files.write("x/y.txt", "async")
            assert await sb.files.read_text("x/y.txt") == "async"
            assert [f.path for f in await sb.files.list("x")] == ["x/y.txt"]
            made = await sb.files.mkdir("x/sub/dir", mode=0o700)
            assert (made.path, made.is_dir, made.mode) == ("x/sub/dir", True, 0o700)
            with pytest.raises(mentis.FailedPrecondition):
                await sb.files.remove("x")  # not empty
            await sb.files.remove("x/y.txt")
            assert [f.path for f in await sb.files.list("x")] == ["x/sub"]
            await sb.files.remove("x", recursive=True)
            with pytest.raises(mentis.NotFound):
                await sb.files.stat("x")
            # Sandbox.list's twin finds it by its labels, in its state.
            found = await AsyncSandbox.list(labels={"suite": tag}, state=["running", "paused"], page_size=1)
            assert [(f.id, f.state) for f in found] == [(sb.id, "running")]
            assert await AsyncSandbox.list(labels={"suite": tag}, state="paused") == []
            assert (await sb.pause()).state == "paused"
            assert (await sb.resume()).state == "running"
            return sb.id

    sandbox_id = asyncio.run(main())
    # The block deleted what it created.
    assert asyncio.run(_state_of(sandbox_id)) == "terminated"


def test_the_async_api_renames_files(env):
    async def main():
        async with AsyncSandbox.create() as sb:
            await sb.files.write("one.txt", "1")
            await sb.files.write("two.txt", "2")
            moved = await sb.files.rename("one.txt", "first.txt")
            assert (moved.path, moved.is_dir, moved.size) == ("first.txt", False, 1)
            with pytest.raises(mentis.AlreadyExists) as exists:
                await sb.files.rename("two.txt", "first.txt")
            assert exists.value.reason == "PATH_EXISTS"
            assert await sb.files.read_text("first.txt") == "1"
            await sb.files.rename("two.txt", "first.txt", overwrite=True)
            assert await sb.files.read_text("first.txt") == "2"
            assert [f.path for f in await sb.files.list()] == ["first.txt"]
            with pytest.raises(mentis.NotFound):
                await sb.files.rename("two.txt", "three.txt")

    asyncio.run(main())


async def _state_of(sandbox_id: str) -> str:
    sb = await AsyncSandbox.connect(sandbox_id)
    await sb.close()
    return sb.state


def test_an_async_stream_cut_by_the_client_is_resumed_and_every_byte_arrives_once(env):
    async def main():
        sb = await AsyncSandbox.create()
        try:
            lines = []
            closing = []

            def on_stdout(text):
                lines.append(text)
                if not closing and "5\n" in "".join(lines):
                    closing.append(asyncio.get_running_loop().create_task(sb._conn.channel.close()))

            r = await sb.run("for i in $(seq 1 40); do echo $i; sleep 0.05; done", on_stdout=on_stdout)
            assert closing
            expected = "".join(f"{i}\n" for i in range(1, 41))
            assert (r.exit_code, r.stdout, "".join(lines)) == (0, expected, expected)
        finally:
            await sb.delete()
            await sb.close()

    asyncio.run(main())


def test_async_errors_are_typed(env):
    async def main():
        with pytest.raises(mentis.NotFound) as missing:
            await AsyncSandbox.connect(str(uuid.uuid4()))
        assert missing.value.reason == "SANDBOX_NOT_FOUND"
        with pytest.raises(mentis.InvalidArgument):
            await AsyncSandbox.create(memory_mb=-5)

    asyncio.run(main())


def test_async_egress_rules_denials_and_secrets(env):
    async def main():
        space = f"async-egress-{uuid.uuid4().hex[:8]}"
        async with AsyncSecrets() as default:
            request = space_pb2.CreateSpaceRequest(space=space_pb2.Space(space_id=space))
            await default._conn.call(default._conn.spaces.CreateSpace, request)
        async with AsyncSecrets(space_id=space) as secrets:
            await secrets.set("API_TOKEN", "tok-1618")
            assert await secrets.list() == ["API_TOKEN"]
            header = {"Authorization": "Bearer {secret:API_TOKEN}"}
            with pytest.raises(ValueError):
                AsyncSandbox.create(space=space, egress="everything")  # refused before any call
            rule = EgressRule(domain="api.example.test", headers=header)
            async with AsyncSandbox.create(space=space, egress="rules", egress_rules=[rule]) as sb:
                kept = EgressRule(domain="api.example.test", ports=[80, 443], headers=header)
                assert (sb.egress, sb.egress_rules) == ("rules", [kept])
                r = await sb.run("curl -sS https://nothing.example.test/ || true")
                assert "Could not resolve host: nothing.example.test" in r.stderr, r
                denials = await sb.egress_denials()
                assert any(d.protocol == "dns" and d.name == "nothing.example.test" for d in denials), denials
                got = await sb.update_egress_rules([EgressRule(cidr="203.0.113.7/32", ports=[22])])
                assert got == sb.egress_rules == [EgressRule(cidr="203.0.113.7/32", ports=[22])]
                assert (await sb.refresh()).egress_rules == got
                with pytest.raises(mentis.InvalidArgument) as bad:
                    await sb.update_egress_rules([EgressRule(domain="*")])
                assert bad.value.field == "sandbox.egress_rules[0].domain", bad.value
            await secrets.delete("API_TOKEN")
            assert await secrets.list() == []
            with pytest.raises(mentis.NotFound):
                await secrets.delete("API_TOKEN")

    asyncio.run(main())
