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
    """The environment a job reads the test server's credentials and endpoint from."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}


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
