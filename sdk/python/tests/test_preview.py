"""Preview URLs (`Sandbox.preview_url`, `revoke_preview_urls`) with both APIs, against a real runtime whose
HTTP listener serves them: `python3 -m http.server` in a real sandbox, reached from here with urllib by the
URL (token in the query) and by the header; refused without a token and after a revoke; bad ports and TTLs
as typed errors; a runtime without the listener; embedded mode, whose runtime has a listener of its own."""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import mentis
from mentis import AsyncSandbox, PreviewUrl, Sandbox

PAGE = "<h1>hello from the sandbox</h1>"
# The page in site/, a web server for it on 0.0.0.0:8000 (http.server's default), and a wait until it answers.
SERVE = (
    f"mkdir -p site && echo '{PAGE}' > site/index.html && "
    "(nohup python3 -m http.server 8000 --directory site >/tmp/http.log 2>&1 &) && "
    "for i in $(seq 100); do "
    "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000), 1)' 2>/dev/null && exit 0; "
    "sleep 0.1; done; cat /tmp/http.log; exit 1"
)


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """The status and body of a GET of `url` (an error status is an answer, not an exception)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def base(url: str) -> str:
    """`http://host:port` of a URL."""
    return url.split("/preview/", 1)[0]


def test_a_web_server_in_the_sandbox_opens_by_its_url_and_stops_when_revoked(env):
    with Sandbox.create() as sb:
        served = sb.run(SERVE)
        assert served.ok, served
        asked = datetime.datetime.now(datetime.timezone.utc)
        p = sb.preview_url(8000, ttl=600)
        assert isinstance(p, PreviewUrl)
        assert p.path == f"/preview/{sb.id}/8000/?mentis_preview_token={p.token}"
        assert p.url == f"http://{env.http_addr}{p.path}"
        assert p.expires_at is not None
        assert datetime.timedelta(seconds=590) < p.expires_at - asked <= datetime.timedelta(seconds=602)

        # The URL as handed out opens the page; so does the token as a header, on any path of the app.
        assert fetch(p.url) == (200, PAGE + "\n")
        app = f"http://{env.http_addr}/preview/{sb.id}/8000"
        assert fetch(f"{app}/index.html", {"X-Mentis-Preview-Token": p.token}) == (200, PAGE + "\n")
        # No token, a wrong one, or one for another port: refused.
        status, body = fetch(f"{app}/")
        assert (status, "no preview token" in body) == (401, True), body
        assert fetch(f"{app}/", {"X-Mentis-Preview-Token": p.token[:-4] + "AAAA"})[0] == 403
        other = sb.preview_url(8001)
        assert fetch(f"{app}/", {"X-Mentis-Preview-Token": other.token})[0] == 403
        # No ttl: an hour.
        hour = sb.preview_url(8000).expires_at - datetime.datetime.now(datetime.timezone.utc)
        assert datetime.timedelta(minutes=59) < hour <= datetime.timedelta(minutes=60, seconds=2)

        # Revoking port 8000 ends every URL of it handed out so far, not another port's; a new one works.
        sb.revoke_preview_urls(8000)
        status, body = fetch(p.url)
        assert (status, "revoked" in body) == (401, True), body
        to_8001 = f"http://{env.http_addr}/preview/{sb.id}/8001/"
        status, body = fetch(to_8001, {"X-Mentis-Preview-Token": other.token})
        assert (status, "nothing answers on port 8001" in body) == (502, True), body
        again = sb.preview_url(8000)
        assert fetch(again.url) == (200, PAGE + "\n")
        # Revoking every port's ends that one too.
        sb.revoke_preview_urls()
        assert fetch(again.url)[0] == 401
        assert fetch(to_8001, {"X-Mentis-Preview-Token": other.token})[0] == 401
        assert fetch(sb.preview_url(8000).url) == (200, PAGE + "\n")


def test_bad_ports_and_ttls_are_invalid_arguments(env):
    with Sandbox.create() as sb:
        # The runtime's judgement: not a port, or the executor's own (no preview reaches it).
        for port in (0, 65536, 50052):
            with pytest.raises(mentis.InvalidArgument) as bad:
                sb.preview_url(port)
            assert bad.value.field == "port", bad.value
            assert str(port) in bad.value.message
        with pytest.raises(mentis.InvalidArgument) as bad:
            sb.revoke_preview_urls(70000)
        assert bad.value.field == "port", bad.value
        with pytest.raises(mentis.InvalidArgument) as bad:
            sb.preview_url(8000, ttl=8 * 24 * 3600)  # over 7 days
        assert bad.value.field == "ttl_seconds", bad.value
        # What no request can carry, refused before one is sent.
        for port in (-1, 2**32, "8000", 8000.0, True, None):
            with pytest.raises(mentis.InvalidArgument) as bad:
                sb.preview_url(port)  # type: ignore[arg-type]
            assert bad.value.field == "port", (port, bad.value)
        with pytest.raises(mentis.InvalidArgument) as bad:
            sb.revoke_preview_urls(0)
        assert "port=None" in bad.value.message
        for ttl in (0, -5, float("nan"), "600"):
            with pytest.raises(mentis.InvalidArgument) as bad:
                sb.preview_url(8000, ttl=ttl)  # type: ignore[arg-type]
            assert bad.value.field == "ttl_seconds", (ttl, bad.value)
        # A fraction of a second is rounded up, never to 0 (an hour).
        short = sb.preview_url(8000, ttl=1.5)
        left = short.expires_at - datetime.datetime.now(datetime.timezone.utc)
        assert left <= datetime.timedelta(seconds=3), left
        gone = sb.id
    # An ended sandbox has no ports.
    ended = Sandbox.connect(gone)
    with pytest.raises(mentis.FailedPrecondition) as bad:
        ended.preview_url(8000)
    assert bad.value.reason == "SANDBOX_ENDED", bad.value
    ended.close()


def test_a_runtime_without_its_http_listener_gives_no_url(runtime):
    from conftest import Runtime

    bare = Runtime(os.environ["MENTIS_RUNTIME_BIN"], http=False)
    try:
        with Sandbox.create(addr=bare.addr, api_key=bare.key) as sb:
            with pytest.raises(mentis.FailedPrecondition) as bad:
                sb.preview_url(8000)
            assert "MENTIS_HTTP_LISTEN" in bad.value.message
    finally:
        bare.stop()


def test_the_async_api_gets_and_revokes_urls(env):
    async def main():
        async with AsyncSandbox.create() as sb:
            served = await sb.run(SERVE)
            assert served.ok, served
            p = await sb.preview_url(8000, ttl=120)
            assert p.url == f"http://{env.http_addr}/preview/{sb.id}/8000/?mentis_preview_token={p.token}"
            assert await asyncio.to_thread(fetch, p.url) == (200, PAGE + "\n")
            await sb.revoke_preview_urls(8000)
            assert (await asyncio.to_thread(fetch, p.url))[0] == 401
            fresh = await sb.preview_url(8000)
            assert await asyncio.to_thread(fetch, fresh.url) == (200, PAGE + "\n")
            await sb.revoke_preview_urls()
            assert (await asyncio.to_thread(fetch, fresh.url))[0] == 401
            with pytest.raises(mentis.InvalidArgument) as bad:
                await sb.preview_url(0)
            assert bad.value.field == "port"

    asyncio.run(main())


def test_embedded_mode_serves_previews_out_of_the_box(runtime, tmp_path):
    # A fresh process with no address: the runtime the SDK starts has an HTTP listener of its own, on
    # another free port, and its URLs open.
    env = {
        k: v for k, v in os.environ.items() if k not in ("MENTIS_ADDR", "MENTIS_API_KEY", "MENTIS_DATA_DIR")
    }
    # Another runtime's listeners and preview settings in the environment are not taken over (its ports
    # would not be free, its URLs would lead elsewhere).
    env["MENTIS_HTTP_LISTEN"] = runtime.http_addr
    env["MENTIS_HEALTH_LISTEN"] = runtime.http_addr
    env["MENTIS_METRICS_LISTEN"] = runtime.http_addr
    env["MENTIS_PREVIEW_BASE_URL"] = "https://elsewhere.example"
    env["MENTIS_PREVIEW_DOMAIN"] = "elsewhere.example"
    script = (
        "import urllib.request\n"
        "import mentis._embedded as e\n"
        "from mentis import Sandbox\n"
        "with Sandbox.create() as sb:\n"
        f"    assert sb.run({SERVE!r}).ok\n"
        "    p = sb.preview_url(8000)\n"
        "    print(p.url.startswith(f'http://{e._runtime.http_addr}/preview/'))\n"
        "    print(e._runtime.http_addr)\n"
        "    print(urllib.request.urlopen(p.url, timeout=60).read().decode(), end='')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    same_prefix, http_addr, page = out.stdout.splitlines()
    assert same_prefix == "True"
    assert http_addr != runtime.http_addr and http_addr.startswith("127.0.0.1:")
    assert page == PAGE


def test_the_guides_preview_example_runs_as_written(env, capsys):
    from test_sync import _python_blocks

    (block,) = _python_blocks("docs/SDK.md", "preview")
    exec(compile(block, "docs/SDK.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"http://{env.http_addr}/preview/"), out
    assert out[1:] == ["200 <h1>hello</h1>", "401"], out
