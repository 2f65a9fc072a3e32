"""Embedded mode: with no address configured, the SDK starts a runtime for this process and stops it at exit.

The runtime binary is, in order: `MENTIS_RUNTIME_BIN`; the one shipped in the wheel (`mentis/_bin/`, in the
platform wheels `make sdk` builds); `mentis-runtime` on PATH. It listens on a free 127.0.0.1 port with a data
folder of its own (a temporary directory, removed at exit) and its own instance name, so it never touches
another runtime's sandboxes; its HTTP listener (preview URLs, the web terminal: MENTIS_HTTP_LISTEN) is on
another free 127.0.0.1 port, so `Sandbox.preview_url` works out of the box. It still needs what every runtime
needs: a Docker engine and the executor image (`make image`, or the offline bundle). At exit, the sandboxes it
made are deleted and it is stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

from .errors import ConfigError

_START_WITHIN = 120.0
_lock = threading.Lock()
_runtime: _Embedded | None = None


def binary() -> str:
    """The runtime binary embedded mode starts (see the module's doc)."""
    explicit = os.environ.get("MENTIS_RUNTIME_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise ConfigError(f"MENTIS_RUNTIME_BIN={explicit!r} is not an executable file")
        return explicit
    shipped = pathlib.Path(__file__).resolve().parent / "_bin" / "mentis-runtime"
    if os.access(shipped, os.X_OK):
        return str(shipped)
    found = shutil.which("mentis-runtime")
    if found:
        return found
    raise ConfigError(
        "no runtime address and no runtime to start: set MENTIS_ADDR (a running runtime), or "
        "MENTIS_RUNTIME_BIN / put mentis-runtime on PATH for embedded mode"
    )


def ensure_started() -> tuple[str, str]:
    """The embedded runtime's address and admin key, starting it on first use."""
    global _runtime
    with _lock:
        if _runtime is None or not _runtime.alive():
            _runtime = _Embedded(binary())
            atexit.register(_runtime.stop)
        return _runtime.addr, _runtime.key


class _Embedded:
    def __init__(self, program: str) -> None:
        self.data = tempfile.mkdtemp(prefix="mentis-embedded-")
        self.instance = f"embedded-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        port, http_port = _free_ports(2)
        self.addr = f"127.0.0.1:{port}"
        # Preview URLs and the web terminal: the runtime's own listener, never one another runtime uses.
        self.http_addr = f"127.0.0.1:{http_port}"
        # Settings meant for another runtime are not taken over: its side listeners (their ports would not be
        # free) and how its preview URLs are written (they would lead to that runtime's listener).
        env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
        env.update(
            MENTIS_LISTEN=self.addr,
            MENTIS_HTTP_LISTEN=self.http_addr,
            MENTIS_DATA_DIR=self.data,
            MENTIS_INSTANCE=self.instance,
            RUST_LOG=os.environ.get("RUST_LOG", "warn"),
        )
        self.log_path = os.path.join(self.data, "runtime.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the runtime's, closed by stop()
        self.proc = subprocess.Popen(
            [program], env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + _START_WITHIN
        key_file = pathlib.Path(self.data, "admin.key")
        while True:
            if self.proc.poll() is not None:
                self._log.close()
                tail = pathlib.Path(self.log_path).read_text(errors="replace")[-2000:]
                shutil.rmtree(self.data, ignore_errors=True)
                raise ConfigError(
                    f"the embedded runtime ({program}) exited with {self.proc.returncode}: {tail}"
                )
            if key_file.exists() and _listening(port):
                self.key = key_file.read_text().strip()
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"the embedded runtime did not start within {_START_WITHIN:.0f} s")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Deletes the sandboxes this runtime made, stops it, removes its data folder."""
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                _delete_all(self.addr, getattr(self, "key", ""))
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.data, ignore_errors=True)


_NOT_INHERITED = frozenset(
    {"MENTIS_HEALTH_LISTEN", "MENTIS_METRICS_LISTEN", "MENTIS_PREVIEW_BASE_URL", "MENTIS_PREVIEW_DOMAIN"}
)


def _free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 now (held together while they are picked)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _delete_all(addr: str, key: str) -> None:
    """Deletes every sandbox the runtime at `addr` lists (every page)."""
    import grpc

    from .v1 import sandbox_pb2, sandbox_pb2_grpc

    channel = grpc.insecure_channel(addr)
    try:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        metadata = [("authorization", f"Bearer {key}")] if key else []
        ids, token = [], ""
        while True:
            page = stub.ListSandboxes(
                sandbox_pb2.ListSandboxesRequest(page_token=token), metadata=metadata, timeout=30
            )
            ids += [sb.sandbox_id for sb in page.sandboxes]
            token = page.next_page_token
            if not token:
                break
        for sandbox_id in ids:
            with contextlib.suppress(grpc.RpcError):
                stub.DeleteSandbox(
                    sandbox_pb2.DeleteSandboxRequest(sandbox_id=sandbox_id), metadata=metadata, timeout=60
                )
    finally:
        channel.close()
