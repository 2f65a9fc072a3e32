"""MCP (docs/MCP.md) driven by the Python `mcp` client package (2.x, pinned in requirements-mcp.txt):
`mentis mcp` on stdio (MENTIS_CLI_BIN, the CLI) and the runtime's streamable HTTP endpoint at /mcp, each
through the connection (`server/discover` for 2026-07-28, or `initialize` for 2025-11-25), list_tools and
call_tool on real sandboxes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pathlib
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from contextlib import asynccontextmanager

import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

TOOLS = {
    "create_sandbox",
    "run_shell",
    "run_python",
    "read_file",
    "write_file",
    "list_files",
    "preview_url",
    "delete_sandbox",
}


def _cli() -> str:
    path = os.environ.get("MENTIS_CLI_BIN", "")
    assert path and os.access(path, os.X_OK), "MENTIS_CLI_BIN must name the mentis CLI (target/debug/mentis)"
    return path


# A client's `mode`: "auto" (the default) asks `server/discover` and lands on the newest protocol, 2026-07-28;
# "legacy" connects with `initialize` at 2025-11-25, as clients before 2026 do. The server speaks both.
MODES = {"auto": LATEST_MODERN_VERSION, "legacy": LATEST_HANDSHAKE_VERSION}


@asynccontextmanager
async def stdio_session(runtime, *args: str, mode: str = "auto"):
    params = StdioServerParameters(
        command=_cli(),
        args=["mcp", "--addr", runtime.addr, *args],
        env={"MENTIS_API_KEY": runtime.key, "PATH": os.environ.get("PATH", "")},
    )
    async with Client(params, mode=mode) as session:
        assert session.protocol_version == MODES[mode], session.protocol_version
        yield session


@asynccontextmanager
async def http_session(runtime, key: str | None = None, mode: str = "auto"):
    headers = {"Authorization": f"Bearer {key or runtime.key}"}
    url = f"http://{runtime.http_addr}/mcp"
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as client,
        Client(streamable_http_client(url, http_client=client), mode=mode) as session,
    ):
        assert session.protocol_version == MODES[mode], session.protocol_version
        yield session


def text(result) -> str:
    assert result.content, result
    assert result.content[0].type == "text", result.content[0]
    return result.content[0].text


async def call(session, tool: str, **args) -> str:
    result = await session.call_tool(tool, args)
    assert not result.is_error, text(result)
    return text(result)


async def refused(session, tool: str, **args) -> str:
    result = await session.call_tool(tool, args)
    assert result.is_error, f"{tool} {args} should be a tool error: {text(result)}"
    return text(result)


def sandbox_id(created: str) -> str:
    first = created.splitlines()[0]
    assert first.startswith("sandbox_id: "), created
    return first.removeprefix("sandbox_id: ")


async def exercise(session) -> None:
    """Every tool once, the way a model would call them, with the outcomes checked."""
    listed = await session.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    for tool in listed.tools:
        assert tool.description, tool.name
        if tool.name != "create_sandbox":
            assert "sandbox_id" in tool.input_schema["required"], tool.input_schema

    key = f"conversation-{uuid.uuid4().hex[:8]}"
    created = await call(session, "create_sandbox", key=key)
    assert "created" in created, created
    sid = sandbox_id(created)
    # The conversation's sandbox is found again by its key.
    again = await call(session, "create_sandbox", key=key)
    assert sandbox_id(again) == sid and "found" in again, again

    out = await call(session, "run_shell", sandbox_id=sid, command="echo out; echo err >&2; exit 3")
    assert out.startswith("exit code: 3"), out
    assert out == "exit code: 3\n--- stdout ---\nout\n--- stderr ---\nerr", out

    await call(session, "run_python", sandbox_id=sid, code="x = 6 * 7")
    out = await call(session, "run_python", sandbox_id=sid, code="print('state kept'); x")
    assert out == "state kept\n42", repr(out)
    out = await call(session, "run_python", sandbox_id=sid, code="1 / 0")
    assert "--- error: ZeroDivisionError: division by zero ---" in out, out
    assert "Traceback" in out and "\x1b" not in out, repr(out)

    assert "wrote 12 bytes" in await call(
        session, "write_file", sandbox_id=sid, path="notes/a.txt", content="héllo world"
    )
    assert await call(session, "read_file", sandbox_id=sid, path="notes/a.txt") == "héllo world"
    listing = await call(session, "list_files", sandbox_id=sid, recursive=True)
    assert "notes/a.txt" in listing and "dir " in listing, listing

    # A server in the sandbox, reached through the URL the tool hands out (its token in it).
    await call(
        session,
        "run_shell",
        sandbox_id=sid,
        command="mkdir -p site && echo 'served by the sandbox' > site/index.html && "
        "(cd site && nohup python3 -m http.server 8000 >/tmp/http.log 2>&1 &) && "
        "timeout 10 bash -c 'until echo > /dev/tcp/127.0.0.1/8000; do sleep 0.1; done' 2>/dev/null",
    )
    url = (await call(session, "preview_url", sandbox_id=sid, port=8000)).split()[0]
    assert "/?mentis_preview_token=" in url, url
    page = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read().decode())
    assert page == "served by the sandbox\n", page
    bad_port = await refused(session, "preview_url", sandbox_id=sid, port=70000)
    assert bad_port.startswith("INVALID_ARGUMENT:"), bad_port

    missing = await refused(session, "read_file", sandbox_id=sid, path="nope.txt")
    assert missing.startswith("NOT_FOUND:") and "PATH_NOT_FOUND" in missing, missing

    assert "deleted" in await call(session, "delete_sandbox", sandbox_id=sid)
    gone = await refused(session, "run_shell", sandbox_id=sid, command="true")
    assert "SANDBOX_ENDED" in gone or gone.startswith("NOT_FOUND:"), gone


@pytest.mark.parametrize("mode", MODES, ids=MODES.values())
def test_stdio(runtime, mode) -> None:
    async def main():
        async with stdio_session(runtime, mode=mode) as session:
            await exercise(session)

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES, ids=MODES.values())
def test_streamable_http(runtime, mode) -> None:
    async def main():
        async with http_session(runtime, mode=mode) as session:
            await exercise(session)

    asyncio.run(main())


def test_long_output_is_cut_with_a_note_and_images_come_as_images(runtime) -> None:
    async def main():
        async with stdio_session(runtime, "--max-output", "2000") as session:
            sid = sandbox_id(await call(session, "create_sandbox"))
            try:
                out = await call(session, "run_shell", sandbox_id=sid, command="seq 1 100000")
                assert len(out) < 2600, len(out)
                assert out.startswith("exit code: 0\n--- stdout ---\n1\n2\n3\n"), out[:60]
                assert out.endswith("99999\n100000"), out[-60:]
                assert "bytes left out of 588895 here" in out, out

                big = "".join(f"line {i}\n" for i in range(2000))
                await call(session, "write_file", sandbox_id=sid, path="big.txt", content=big)
                first = await call(session, "read_file", sandbox_id=sid, path="big.txt")
                assert first.startswith("line 0\n"), first[:100]
                assert "read_file with offset 2000 reads on" in first, first[-200:]
                more = await call(session, "read_file", sandbox_id=sid, path="big.txt", offset=2000)
                assert more.startswith(big[2000:2100]), more[:100]

                code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
                result = await session.call_tool("run_python", {"sandbox_id": sid, "code": code})
                assert not result.is_error, result
                images = [c for c in result.content if c.type == "image"]
                assert len(images) == 1 and images[0].mime_type == "image/png", result.content
                assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
            finally:
                await call(session, "delete_sandbox", sandbox_id=sid)

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES, ids=MODES.values())
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_bad_arguments_are_refused_clearly(runtime, transport, mode) -> None:
    """The API's refusals are tool errors; so are arguments that do not fit a tool, and a tool that does not
    exist is the protocol's error: docs/MCP.md's calls as the client package gives them (a result with
    is_error, or an MCPError)."""

    async def main():
        connect = stdio_session if transport == "stdio" else http_session
        async with connect(runtime, mode=mode) as session:
            bad = await refused(session, "run_shell", sandbox_id="no-such-sandbox", command="true")
            assert bad.startswith("INVALID_ARGUMENT:") and "not a UUID" in bad, bad
            unknown = await refused(session, "read_file", sandbox_id=str(uuid.uuid4()), path="a")
            assert unknown.startswith("NOT_FOUND:"), unknown
            for params, kind, answer in _guide_calls():
                if kind == "result":
                    result = await session.call_tool(params["name"], params["arguments"])
                    assert result.is_error is answer["isError"], (params, result)
                    content = [{"type": c.type, "text": c.text} for c in result.content]
                    assert content == answer["content"], (params, content)
                else:
                    with pytest.raises(MCPError) as e:
                        await session.call_tool(params["name"], params["arguments"])
                    assert (e.value.code, e.value.message) == (answer["code"], answer["message"]), params
                    assert e.value.data is None, e.value.data

    asyncio.run(main())


def _guide_calls() -> list[tuple[dict, str, dict]]:
    """docs/MCP.md's calls that do not fit (its `mcp:malformed` block): the params of each `tools/call`, and
    its answer's kind ("result" or "error") and value, as the server gives them at 2025-11-25."""
    lines = [line for line in _guide_block("malformed").splitlines() if line]
    calls = []
    for ask, answer in zip(lines[::2], lines[1::2], strict=True):
        assert ask.startswith("→ tools/call {") and answer.startswith("← "), (ask, answer)
        kind, value = answer.removeprefix("← ").split(" ", 1)
        assert kind in ("result", "error"), answer
        calls.append((json.loads(ask.removeprefix("→ tools/call ")), kind, json.loads(value)))
    # A missing argument, one of the wrong type, one the tool does not have, and a tool that does not exist.
    assert len(calls) == 4 and [kind for _, kind, _ in calls] == ["result"] * 3 + ["error"], calls
    return calls


CLIENT_INFO = {"name": "test", "version": "0"}
# The `_meta` every request carries at 2026-07-28, where there is no `initialize` to say who the client is.
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": LATEST_MODERN_VERSION,
    "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _request(request_id: int, method: str, params: dict, version: str) -> dict:
    if version == LATEST_MODERN_VERSION:
        params = {**params, "_meta": MODERN_META}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


async def _stdio_answers(runtime, version: str, calls: list[dict]) -> list[dict]:
    """`mentis mcp`'s answers to `tools/call`s written on its standard input as JSON lines; at 2025-11-25
    after `initialize`, at 2026-07-28 with the `_meta` of each request."""
    proc = await asyncio.create_subprocess_exec(
        _cli(),
        "mcp",
        "--addr",
        runtime.addr,
        env={**os.environ, "MENTIS_API_KEY": runtime.key},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin and proc.stdout

    async def send(message: dict) -> dict | None:
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        while "id" in message:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            assert line, "mentis mcp closed its output"
            answer = json.loads(line)
            if answer.get("id") == message["id"]:
                return answer
        return None

    try:
        if version == LATEST_HANDSHAKE_VERSION:
            hello = {"protocolVersion": version, "capabilities": {}, "clientInfo": CLIENT_INFO}
            started = await send(_request(1, "initialize", hello, version))
            assert started and started["result"]["protocolVersion"] == version, started
            await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return [await send(_request(i, "tools/call", params, version)) for i, params in enumerate(calls, 2)]
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), timeout=30)


def _http_answers(runtime, version: str, calls: list[dict]) -> list[dict]:
    """/mcp's answers to `tools/call`s, one POST each (the server is stateless), each a 200 with JSON."""
    answers = []
    for i, params in enumerate(calls, 2):
        headers = {"Authorization": f"Bearer {runtime.key}", "MCP-Protocol-Version": version}
        if version == LATEST_MODERN_VERSION:
            headers |= {"Mcp-Method": "tools/call", "Mcp-Name": params["name"]}
        with _post(runtime, _request(i, "tools/call", params, version), headers) as answer:
            assert answer.status == 200, answer.status
            assert answer.headers["Content-Type"].startswith("application/json"), answer.headers
            answers.append(json.loads(answer.read()))
    return answers


@pytest.mark.parametrize("version", MODES.values())
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_calls_that_do_not_fit_are_answered_as_the_guide_shows(runtime, transport, version) -> None:
    """docs/MCP.md's calls that do not fit, written as JSON-RPC, answered with exactly the JSON the guide
    shows, over both transports and at both protocol versions (2026-07-28 adds `resultType` to a result)."""
    calls = _guide_calls()
    params = [p for p, _, _ in calls]
    if transport == "stdio":
        answers = asyncio.run(_stdio_answers(runtime, version, params))
    else:
        answers = _http_answers(runtime, version, params)
    for i, ((p, kind, value), answer) in enumerate(zip(calls, answers, strict=True), 2):
        if kind == "result" and version == LATEST_MODERN_VERSION:
            value = {"resultType": "complete", **value}
        assert answer == {"jsonrpc": "2.0", "id": i, kind: value}, (p, answer)


def _post(runtime, message: dict, headers: dict[str, str]):
    req = urllib.request.Request(
        f"http://{runtime.http_addr}/mcp",
        data=json.dumps(message).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
        method="POST",
    )
    return urllib.request.urlopen(req, timeout=30)


def _post_initialize(runtime, headers: dict[str, str]):
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": CLIENT_INFO}
    return _post(runtime, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-a-key"}], ids=["no key", "wrong key"])
def test_http_needs_a_key(runtime, headers) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        _post_initialize(runtime, headers)
    assert e.value.code == 401
    assert e.value.headers["WWW-Authenticate"] == "Bearer"
    # The same request with the key is answered.
    with _post_initialize(runtime, {"Authorization": f"Bearer {runtime.key}"}) as ok:
        assert ok.status == 200
        assert json.loads(ok.read())["result"]["serverInfo"]["name"] == "mentis"


def _guide_block(name: str) -> str:
    """The fenced block after `<!-- mcp:NAME -->` in docs/MCP.md."""
    guide = (pathlib.Path(__file__).resolve().parents[3] / "docs/MCP.md").read_text()
    after = guide.split(f"<!-- mcp:{name} -->\n", 1)[1]
    assert after.startswith("```"), f"no fenced block after mcp:{name}"
    return after.split("\n", 1)[1].split("\n```\n", 1)[0]


def test_the_guides_configurations_and_example_work_as_written(runtime) -> None:
    stdio = json.loads(_guide_block("stdio"))["mcpServers"]["mentis"]
    assert stdio["command"] == "mentis" and stdio["args"] == ["mcp"], stdio
    assert set(stdio["env"]) == {"MENTIS_ADDR", "MENTIS_API_KEY"}, stdio
    http = json.loads(_guide_block("http"))["mcpServers"]["mentis"]
    assert http["type"] == "http" and http["url"] == "http://127.0.0.1:8080/mcp", http
    assert http["headers"] == {"Authorization": "Bearer <an API key>"}, http

    async def main():
        # The stdio configuration: the client starts `mentis mcp` with the env it names.
        env = {"MENTIS_ADDR": f"http://{runtime.addr}", "MENTIS_API_KEY": runtime.key}
        params = StdioServerParameters(command=_cli(), args=stdio["args"], env=env)
        async with Client(params) as session:
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        # The HTTP one: its URL on this runtime's listener, its header with the key.
        headers = {k: v.replace("<an API key>", runtime.key) for k, v in http["headers"].items()}
        url = http["url"].replace("127.0.0.1:8080", runtime.http_addr)
        async with (
            httpx2.AsyncClient(headers=headers) as client,
            Client(streamable_http_client(url, http_client=client)) as session,
        ):
            assert {t.name for t in (await session.list_tools()).tools} == TOOLS

    asyncio.run(main())

    # The Python example, on this runtime's listener.
    example = _guide_block("python").replace("127.0.0.1:8080", runtime.http_addr)
    done = subprocess.run(
        [sys.executable, "-c", example],
        env={**os.environ, "MENTIS_API_KEY": runtime.key},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "45\n", done.stdout


def test_a_key_limited_to_a_space_reaches_only_that_space_over_http(runtime) -> None:
    import grpc
    from mentis.v1 import key_pb2, key_pb2_grpc, space_pb2, space_pb2_grpc

    space = f"mcp-{uuid.uuid4().hex[:8]}"
    admin = [("authorization", f"Bearer {runtime.key}")]
    with grpc.insecure_channel(runtime.addr) as channel:
        space_pb2_grpc.SpaceServiceStub(channel).CreateSpace(
            space_pb2.CreateSpaceRequest(space=space_pb2.Space(space_id=space)), metadata=admin
        )
        secret = (
            key_pb2_grpc.KeyServiceStub(channel)
            .CreateApiKey(key_pb2.CreateApiKeyRequest(name="mcp", space_ids=[space]), metadata=admin)
            .secret
        )

    async def main():
        async with http_session(runtime, key=secret) as session:
            other = await refused(session, "create_sandbox")
            assert other.startswith("PERMISSION_DENIED:"), other
            sid = sandbox_id(await call(session, "create_sandbox", space=space))
            try:
                out = await call(session, "run_shell", sandbox_id=sid, command="echo $((6*7))")
                assert out.endswith("42"), out
            finally:
                await call(session, "delete_sandbox", sandbox_id=sid)

    asyncio.run(main())


def test_a_dropped_connection_mid_command_loses_and_repeats_nothing(runtime, proxy) -> None:
    """`mentis mcp` through a proxy that resets every connection while a command prints: the tool submits the
    same action id again, the runtime replays the action instead of running it twice, and the model gets
    every line once."""

    async def main():
        params = StdioServerParameters(
            command=_cli(), args=["mcp", "--addr", proxy.addr], env={"MENTIS_API_KEY": runtime.key}
        )
        async with Client(params) as session:
            sid = sandbox_id(await call(session, "create_sandbox"))
            try:
                command = "for i in $(seq 1 8); do echo line$i; sleep 0.3; done; date +%s%N > ran.$RANDOM"
                running = asyncio.ensure_future(
                    session.call_tool("run_shell", {"sandbox_id": sid, "command": command})
                )
                await asyncio.sleep(1.2)
                assert not running.done()
                proxy.cut()
                result = await running
                assert not result.is_error, text(result)
                lines = "\n".join(f"line{i}" for i in range(1, 9))
                assert text(result) == f"exit code: 0\n--- stdout ---\n{lines}", text(result)
                assert proxy.cuts == 1
                # It ran once: one marker file.
                listing = await call(session, "list_files", sandbox_id=sid)
                assert listing.count(" ran.") == 1, listing
            finally:
                await call(session, "delete_sandbox", sandbox_id=sid)

    asyncio.run(main())
