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
    60 s, not the 10 s default: moto answers from a thread of the test process, which under the suite's
    load has missed 10 s, and each request is now sent 3 times, no more (it was 18: see
    dstore.formats.objects). The wait for a pooled connection, which once waited without end here, is
    bounded now (dstore.formats.s3session; tests/test_object_waits.py). The stall tests set their own."""
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
    endpoint that hangs does. With `pattern`, only a connection whose request names it stalls, from
    that request on (`/offsets/c/`: Zarr's reads of the offsets' chunks). `url` is its endpoint;
    `close()` ends it (also as a context manager)."""

    def __init__(self, upstream: str | None = None, marker: str | None = None, pattern: str | None = None):
        import threading

        self._upstream = (
            None if upstream is None else (upstream.split("//")[1].split(":")[0], int(upstream.rsplit(":", 1)[1]))
        )
        self._marker, self._held, self._closed = marker, [], False
        self._pattern = None if pattern is None else pattern.encode()
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
                named = threading.Event()  # this connection asked for `pattern`: its answers stall
                threading.Thread(target=self._pump, args=(conn, up, named, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(up, conn, named, False), daemon=True).start()

    def _pump(self, src, dst, named, asking: bool) -> None:
        import select

        while not self._closed:
            if self._check() or (named.is_set() and not asking):
                return  # stalled: the connection stays open, nothing more goes through
            try:
                ready, _, _ = select.select([src], [], [], 0.1)
                if ready:
                    data = src.recv(65536)
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    if asking and self._pattern is not None and self._pattern in data.split(b"\r\n", 1)[0]:
                        named.set()
                    if self._check() or (named.is_set() and not asking):
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


class ScriptedS3:
    """A small S3 endpoint whose answer depends on the object's key (or the listing's prefix), for the
    waits of dstore.formats.objects: real sockets and real HTTP, what a stalled or slow store does.

    Every object is SIZE bytes (one containing `big`: BIG, past s3fs's 50 MiB block, which it reads
    as concurrent ranges) with one ETag, byte i being i % 251. A key containing
      `good`      is answered (HEAD, ranged GET);
      `silent`    gets its HEAD answered and a GET (or a listing) never answered;
      `stalls`    gets a GET's (or a listing's) headers and a few body bytes, then nothing;
      `trickle`   gets a GET's headers, then one byte every `trickle_s` seconds (a slow answer that
                  holds its connection: what fills a pool without anything leaking).
    `requests[(method, key)]` counts what arrived; `held()` is how many connections that the server
    stalls on the client still keeps open (a client that gave up closes them). `close()` ends it."""

    SIZE = 4096
    BIG = 64 << 20

    def __init__(self, trickle_s: float = 0.05):
        import collections
        import threading

        self.trickle_s = trickle_s
        self.requests: collections.Counter = collections.Counter()
        self._stalled: set = set()
        self._lock = threading.Lock()
        self._closed = False
        self._conns: list = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def held(self) -> int:
        """Stalled connections the client has not closed (each checked for its end first)."""
        import select

        with self._lock:
            stalled = list(self._stalled)
        for conn in stalled:
            try:
                ready, _, _ = select.select([conn], [], [], 0)
                if ready and not conn.recv(1, socket.MSG_PEEK):
                    with self._lock:
                        self._stalled.discard(conn)
            except OSError:
                with self._lock:
                    self._stalled.discard(conn)
        with self._lock:
            return len(self._stalled)

    def _accept(self) -> None:
        import threading

        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _stall(self, conn) -> None:
        import time

        with self._lock:
            self._stalled.add(conn)
        while not self._closed:
            time.sleep(0.05)

    def _serve(self, conn) -> None:
        import email.utils
        import time

        meta = f'ETag: "e0"\r\nLast-Modified: {email.utils.formatdate(usegmt=True)}\r\n'
        pending = b""
        try:
            while not self._closed:
                while b"\r\n\r\n" not in pending:
                    got = conn.recv(65536)
                    if not got:
                        return
                    pending += got
                head, pending = pending.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                key = target.rsplit("/", 1)[-1] if "?" not in target else target  # a listing: its query
                with self._lock:
                    self.requests[(method, key)] += 1
                size = self.BIG if "big" in key else self.SIZE
                if method == "HEAD":
                    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n{meta}\r\n".encode())
                    continue
                ranges = [x.split("=", 1)[1] for x in lines[1:] if x.lower().startswith("range:")]
                a, b = (int(x or size - 1) for x in ranges[0].split("-")) if ranges else (0, size - 1)
                b = min(b, size - 1)
                part = bytes((a + i) % 251 for i in range(min(b + 1 - a, self.SIZE)))  # what a stall needs
                status = f"206 Partial Content\r\nContent-Range: bytes {a}-{b}/{size}" if ranges else "200 OK"
                headers = f"HTTP/1.1 {status}\r\nContent-Length: {b + 1 - a}\r\n{meta}\r\n".encode()
                if "silent" in key:
                    return self._stall(conn)
                if "stalls" in key:
                    conn.sendall(headers + part[:3])
                    return self._stall(conn)
                if "trickle" in key:
                    conn.sendall(headers)
                    for i in range(len(part)):
                        if self._closed:
                            return
                        conn.sendall(part[i : i + 1])
                        time.sleep(self.trickle_s)
                    continue
                conn.sendall(headers + part)
        except OSError:
            return

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
