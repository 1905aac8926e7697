"""Fixtures: the real klserve binary ($KLSERVE_BIN) on a free loopback
port, with the Python client (the `klserve` package, pip install
client/python) pointed at it."""

import contextlib
import os
import pathlib
import queue
import re
import subprocess
import sys
import threading
import time

import grpc
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # reference

import klserve  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]


def klserve_bin():
    path = os.environ.get("KLSERVE_BIN")
    if path:
        return path
    for build in ("build", "build-py"):
        candidate = REPO / build / "server" / "klserve"
        if candidate.is_file():
            return str(candidate)
    pytest.fail("set KLSERVE_BIN to the klserve binary (e.g. "
                "build/server/klserve)")


class Server:
    """One klserve process. Listening on port 0, it picks a free port and
    names it on stderr ("serving on port N"), which is read here, so there
    is no window in which another process could take the port."""

    def __init__(self, *flags, listen="127.0.0.1:0", timeout=30.0,
                 client_options=None, launcher=()):
        # What every client of this server needs (TLS files, a token).
        self.client_options = dict(client_options or {})
        # launcher: a command that runs the binary (an emulator), or none.
        self.args = [*launcher, klserve_bin(), "--listen=" + listen,
                     "--metrics_listen=", "--threads=2", *flags]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        lines = queue.Queue()

        def drain():  # keeps the pipe from filling up
            for line in self.proc.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        self.port = None
        while self.port is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError("klserve did not start: " +
                                   "".join(self.log))
            m = re.search(r"serving on port (\d+)", line)
            if m:
                self.port = int(m.group(1))
        self.target = "127.0.0.1:%d" % self.port
        with self.client(deadline=timeout) as client:
            if not client.health():
                raise RuntimeError("klserve not SERVING")

    def client(self, **kwargs):
        return klserve.Client(self.target, **{**self.client_options, **kwargs})

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def held_stream_slot(server):
    """A ComputeLossStream that sends nothing: it holds one of `server`'s
    stream slots until the server's --stream_idle_timeout ends it, or the
    block does. Yields the call."""
    from klserve.v1 import klserve_pb2_grpc
    release = threading.Event()

    def nothing():
        release.wait()
        return
        yield

    with grpc.insecure_channel(server.target) as channel:
        call = klserve_pb2_grpc.IndexerKlStub(channel).ComputeLossStream(
            nothing(), timeout=30)
        time.sleep(0.2)  # for the server to take the slot
        try:
            yield call
        finally:
            release.set()
            call.cancel()


@pytest.fixture(scope="session")
def server():
    srv = Server()
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


@pytest.fixture(scope="session")
def small_server():
    """A server whose message limit (256 KiB) forces larger problems onto
    ComputeLossStream."""
    srv = Server("--max_message_bytes=262144")
    yield srv
    assert srv.stop() == 0, "".join(srv.log)


@pytest.fixture(scope="session")
def client(server):
    with server.client(deadline=60.0) as c:
        yield c
