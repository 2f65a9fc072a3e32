"""A real runtime for the SDK's tests: `MENTIS_RUNTIME_BIN` (make test-sdk passes target/debug/mentis-runtime)
on a free 127.0.0.1 port with a data folder of its own, real Docker sandboxes behind it. Every sandbox the
tests leave is deleted before the runtime stops."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runtime:
    def __init__(self, binary: str, *, http: bool = True) -> None:
        self.data = tempfile.TemporaryDirectory(prefix="mentis-sdk-")
        self.port = _free_port()
        self.addr = f"127.0.0.1:{self.port}"
        # The HTTP listener: the web terminal's page and MCP's streamable HTTP endpoint (/mcp).
        self.http_addr = f"127.0.0.1:{_free_port()}" if http else ""
        self.instance = f"sdk-{uuid.uuid4().hex[:8]}"
        env = dict(os.environ)
        env.update(
            MENTIS_LISTEN=self.addr,
            MENTIS_HTTP_LISTEN=self.http_addr,  # empty: none
            MENTIS_DATA_DIR=self.data.name,
            MENTIS_INSTANCE=self.instance,
            RUST_LOG=os.environ.get("RUST_LOG", "warn"),
        )
        for name in ("MENTIS_ADDR", "MENTIS_API_KEY"):
            env.pop(name, None)
        # The runtime's log, kept open for its life and closed by stop().
        self.log = open(pathlib.Path(self.data.name).parent / f"{self.instance}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen([binary], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the runtime exited with {self.proc.returncode}; log: {self.log.name}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                key_file = pathlib.Path(self.data.name, "admin.key")
                if key_file.exists():
                    self.key = key_file.read_text().strip()
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the runtime did not listen within 120 s; log: {self.log.name}")
            time.sleep(0.1)

    def delete_all(self) -> None:
        from mentis._embedded import _delete_all

        _delete_all(self.addr, self.key)

    def stop(self) -> None:
        try:
            self.delete_all()
        finally:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
            self.data.cleanup()
            self.sweep()

    def sweep(self) -> None:
        """Removes whatever Docker objects of this runtime's instance are left (none, when every test and the
        delete above did their part): the tests leave no container or volume behind, even when they fail."""
        label = f"label=io.mentis.instance={self.instance}"
        for kind, listing in (("container", ["ps", "-aq"]), ("volume", ["volume", "ls", "-q"])):
            left = subprocess.run(
                ["docker", *listing, "--filter", label], capture_output=True, text=True, check=False
            ).stdout.split()
            if left:
                print(f"conftest: removing {len(left)} {kind}(s) instance {self.instance} left", flush=True)
                subprocess.run(["docker", kind, "rm", "-f", *left], capture_output=True, check=False)


@pytest.fixture(scope="session")
def runtime():
    binary = os.environ.get("MENTIS_RUNTIME_BIN")
    if not binary:
        pytest.fail("MENTIS_RUNTIME_BIN must name the mentis-runtime to test against (make test-sdk sets it)")
    rt = Runtime(binary)
    yield rt
    rt.stop()


@pytest.fixture
def env(runtime, monkeypatch):
    """MENTIS_ADDR and MENTIS_API_KEY point at the test runtime."""
    monkeypatch.setenv("MENTIS_ADDR", runtime.addr)
    monkeypatch.setenv("MENTIS_API_KEY", runtime.key)
    return runtime


class CuttableProxy:
    """A TCP proxy in front of the runtime that the test can cut: every open connection is reset at once, as a
    network drop would, and new connections are let through again."""

    def __init__(self, target_port: int) -> None:
        import threading

        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        import struct

        with self._lock:
            sockets, self._open = self._open, []
            self.cuts += 1
        for s in sockets:
            # SO_LINGER 0: close with a reset, as a dropped network would end it. A socket another thread is
            # blocked reading is only released (and the reset only sent) when that read returns: shutting its
            # reading side down first makes it return now, not when the peer next sends something.
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def proxy(runtime):
    p = CuttableProxy(runtime.port)
    yield p
    p.close()
