"""A real S3 server for tests: moto's server mode on a free local port, with dummy credentials and the
endpoint given through the environment (as a user's job reads them), never a mock of our own.

    from support.s3 import endpoint, s3, bucket  # noqa: F401 - fixtures, used by name

Skips the importing test module where s3fs or moto's server is not installed."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("s3fs", reason="object storage is optional (pip install 'dstore-mpi[object]')")
moto_server = pytest.importorskip("moto.server", reason="the test S3 server is moto's (pip install 'moto[server]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    """A real S3 server (moto) on a free local port, for the module."""
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def environment(endpoint: str) -> dict[str, str]:
    """The environment a job reads the test server's credentials and endpoint from. The wait bound is
    botocore's own default (60 s), as before $DSTORE_OBJECT_TIMEOUT: moto answers from a thread of the
    test process, which under the suite's load missed the 10 s default, and an in-process verify then
    waited without end for a pooled connection (aiohttp's pool wait is not bounded by botocore's
    connect/read timeouts: found in CI, see the closing note of issue 39). The stall tests set their own."""
    return {
        "DSTORE_OBJECT_TIMEOUT": "60",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }


@pytest.fixture
def s3(endpoint, monkeypatch):
    """An s3fs file system on the test server, with the credentials and endpoint set in the
    environment (what dstore reads, and what an mpiexec job launched by the test inherits)."""
    import fsspec

    for key, value in environment(endpoint).items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    fsspec.filesystem("s3").clear_instance_cache()
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    yield fs
    fsspec.filesystem("s3").clear_instance_cache()


_buckets = iter(range(1_000_000))


def bucket(fs) -> str:
    """A new bucket on the test server (one per test: tests do not see each other's objects)."""
    name = f"bucket-{next(_buckets)}"
    fs.mkdir(name)
    return name


class StallingProxy:
    """A TCP proxy in front of the S3 server that can stall: it forwards every connection to
    `upstream` until the file `marker` exists (or at once, with `upstream=None`: a server that accepts
    and never answers), and from then on forwards nothing, holding every connection open, as an
    endpoint that hangs does. `url` is its endpoint; `close()` ends it (also as a context manager)."""

    def __init__(self, upstream: str | None = None, marker: str | None = None):
        import threading

        self._upstream = (
            None if upstream is None else (upstream.split("//")[1].split(":")[0], int(upstream.rsplit(":", 1)[1]))
        )
        self._marker, self._held, self._closed = marker, [], False
        self.stalled = threading.Event()
        if upstream is None:
            self.stalled.set()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _check(self) -> bool:
        import os

        if self._marker is not None and os.path.exists(self._marker):
            self.stalled.set()
        return self.stalled.is_set()

    def _accept(self) -> None:
        import threading

        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the 0.1 s timeout, or closed
                continue
            self._held.append(conn)
            if not self._check() and self._upstream is not None:
                up = socket.create_connection(self._upstream)
                self._held.append(up)
                threading.Thread(target=self._pump, args=(conn, up), daemon=True).start()
                threading.Thread(target=self._pump, args=(up, conn), daemon=True).start()

    def _pump(self, src, dst) -> None:
        import select

        while not self._closed:
            if self._check():
                return  # stalled: the connection stays open, nothing more goes through
            try:
                ready, _, _ = select.select([src], [], [], 0.1)
                if ready:
                    data = src.recv(65536)
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    if self._check():
                        return
                    dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed = True
        for s in [self._sock, *self._held]:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
