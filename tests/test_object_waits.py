"""Every wait of a request to object storage is bounded, the wait for a pooled connection too; a request
is sent $DSTORE_OBJECT_TRIES times, no more; requests that timed out give their connections back
(issue 39 item 4; dstore.formats.objects, dstore.formats.s3session). Against a real HTTP endpoint on
a local port whose answers stall by key (support.s3.ScriptedS3): no mock of s3fs, botocore or aiohttp."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support import s3 as s3_server
from support.s3 import ScriptedS3, bucket, environment

from dstore.errors import FormatError
from dstore.formats import objects

endpoint, s3 = s3_server.endpoint, s3_server.s3  # the moto server's fixtures (used by name)
WAIT = "after no answer within 0.3 s, {tries} tries ($DSTORE_OBJECT_TIMEOUT, $DSTORE_OBJECT_TRIES)"


@pytest.fixture
def server(monkeypatch):
    """The scripted endpoint, with the environment a job reads (0.3 s, 2 tries), fsspec's cached file
    systems dropped before and after (their endpoint is the environment's at their making)."""
    import fsspec

    with ScriptedS3() as s:
        for key, value in {**environment(s.url), "DSTORE_OBJECT_TIMEOUT": "0.3", "DSTORE_OBJECT_TRIES": "2"}.items():
            monkeypatch.setenv(key, value)
        for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "DSTORE_OBJECT_CONNECTIONS"):
            monkeypatch.delenv(key, raising=False)
        fsspec.filesystem("s3").clear_instance_cache()
        yield s
        fsspec.filesystem("s3").clear_instance_cache()


def one_line(exc: pytest.ExceptionInfo, url: str, tries: int) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.startswith(url + ":") and text.endswith(WAIT.format(tries=tries)), text
    return text


def test_a_request_that_finds_every_pooled_connection_busy_ends_with_one_line_naming_the_wait(server, monkeypatch):
    """One connection in the pool, held by a read whose answer trickles (a byte each 0.05 s: never a read
    timeout, 200 s in all): a HEAD waits for that connection 0.3 s, twice, and ends with the line. Before
    dstore.formats.s3session it waited as long as the trickle (without end, for a stuck connection)."""
    monkeypatch.setenv("DSTORE_OBJECT_CONNECTIONS", "1")
    slow = objects.ObjectFile("s3://b/trickle")
    holder = threading.Thread(target=_read_ignoring_errors, args=(slow,), daemon=True)
    holder.start()
    deadline = time.monotonic() + 30
    while server.requests[("GET", "trickle")] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.requests[("GET", "trickle")] == 1
    with pytest.raises(FormatError) as exc:
        objects.stat("s3://b/good")
    assert "Connect timeout" in one_line(exc, "s3://b/good", 2)
    assert server.requests[("HEAD", "good")] == 0  # it never had a connection: the wait was the pool's
    server.close()  # ends the trickle; its read fails
    holder.join(timeout=30)
    assert not holder.is_alive()


def _read_ignoring_errors(f: objects.ObjectFile) -> None:
    try:
        f.pread_into(memoryview(bytearray(ScriptedS3.SIZE)), 0)
    except FormatError:
        pass  # the server closed under it: the test's end


@pytest.mark.parametrize("tries", [1, 3])
def test_a_request_that_never_answers_is_sent_tries_times_then_one_line(server, monkeypatch, tries):
    """A ranged GET and a listing that get no answer are each sent $DSTORE_OBJECT_TRIES times (were
    2 x tries^2: botocore's max_attempts=1 is two attempts, and s3fs nests two loops of its tries)."""
    monkeypatch.setenv("DSTORE_OBJECT_TRIES", str(tries))
    with pytest.raises(FormatError) as exc:
        objects.ObjectFile("s3://b/silent").pread_into(memoryview(bytearray(100)), 0)
    assert "ReadTimeoutError" in one_line(exc, "s3://b/silent", tries)
    assert server.requests[("GET", "silent")] == tries
    with pytest.raises(FormatError) as exc:
        objects.list_below("s3://b/silent/")
    one_line(exc, "s3://b/silent/", tries)
    assert [n for (method, key), n in server.requests.items() if "list-type" in key] == [tries]


def test_an_answer_that_stops_mid_way_is_asked_again_then_one_line(server):
    """Headers and 3 bytes, then nothing: the read is asked again (botocore had returned), and ends with
    the line naming the URL and the wait (was `IndexError: tuple index out of range` from s3fs's S3File)."""
    with pytest.raises(FormatError) as exc:
        objects.ObjectFile("s3://b/stalls").pread_into(memoryview(bytearray(100)), 0)
    assert "Read timeout on endpoint URL" in one_line(exc, "s3://b/stalls", 2)
    assert server.requests[("GET", "stalls")] == 2
    with pytest.raises(FormatError) as exc:
        objects.read_object("s3://b/stalls")  # a manifest's read: s3fs's cat_file
    assert "Read timeout on endpoint URL" in one_line(exc, "s3://b/stalls", 2)


def test_requests_that_timed_out_give_their_connections_back(server, monkeypatch):
    """A pool of 2 and 10 requests that time out (no answer; an answer that stops; ranged reads,
    listings, whole objects, an ingest's reads, whole objects past s3fs's 50 MiB block): the client
    closes every stalled connection, and the pool then serves a read at once. A whole object past
    50 MiB whose answer stopped kept 2 connections for good (s3fs's concurrent ranges: the module
    docstring of dstore.formats.objects), so the next request waited for the pool without end."""
    from dstore.errors import SampleError
    from dstore.ingest.remote import Remote

    monkeypatch.setenv("DSTORE_OBJECT_CONNECTIONS", "2")
    monkeypatch.setenv("DSTORE_OBJECT_TRIES", "1")
    for key in ("silent", "stalls"):
        for call in (
            lambda k: objects.ObjectFile(f"s3://b/{k}").pread_into(memoryview(bytearray(100)), 7),
            lambda k: objects.list_below(f"s3://b/{k}/"),
            lambda k: objects.read_object(f"s3://b/{k}"),
            lambda k: objects.read_object(f"s3://b/{k}-big"),
            lambda k: Remote(f"s3://b/{k}-big").read(f"s3://b/{k}-big"),
        ):
            with pytest.raises((FormatError, SampleError)) as exc:
                call(key)
            assert "after no answer within 0.3 s, 1 tries" in str(exc.value)
    deadline = time.monotonic() + 10
    while server.held() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.held() == 0  # every stalled connection closed by the client
    view = memoryview(bytearray(100))
    assert objects.ObjectFile("s3://b/good").pread_into(view, 7) == 100
    assert bytes(view) == bytes((7 + i) % 251 for i in range(100))


def test_zarrs_own_reads_go_through_the_bounded_file_system(s3, tmp_path):
    """Zarr's store (the group's metadata, the index arrays) reads through dstore's file system, with its
    bounded pool and its tries (was: an instance of Zarr's making, fsspec's cache missed on the order of
    the arguments, with the default pool and s3fs's 5 x 5 nested tries around botocore's)."""
    from store_scenarios import scenarios
    from zarr.storage import FsspecStore

    from dstore.formats import open_container
    from dstore.formats.s3session import BoundedAIOHTTPSession
    from dstore.formats.zarr_backend import ZarrReader

    local = scenarios.make_container(str(tmp_path / "c.zarr"), n=5, seed=1, fmt="zarr")
    b = bucket(s3)
    s3.put(local, f"{b}/c.zarr", recursive=True)
    with open_container(f"s3://{b}/c.zarr") as reader, open_container(local) as here:
        assert [bytes(reader.sample(i)[0]) for i in range(5)] == [bytes(here.sample(i)[0]) for i in range(5)]
        assert isinstance(reader, ZarrReader)
        store = reader._open_group().store
        assert isinstance(store, FsspecStore)
        fs: Any = store.fs  # s3fs's S3FileSystem (typed as fsspec's AsyncFileSystem)
        assert fs is objects.bounded_filesystem("s3", asynchronous=True)
        assert fs.retries == 1 and fs.max_concurrency == 1
        assert isinstance(fs._s3._endpoint.http_session, BoundedAIOHTTPSession)


def test_zarrs_own_read_that_gets_no_answer_ends_with_one_line_naming_the_wait(
    s3, endpoint, tmp_path, capsys, monkeypatch
):
    """`dstore verify` of a Zarr container whose offsets' chunk objects get no answer (a proxy stalls the
    connections that ask for them), in this process: one line naming the container, the object and the
    wait (was: the wait not named)."""
    import fsspec
    from store_scenarios import scenarios
    from support.s3 import StallingProxy

    from dstore.tools.cli import main

    local = scenarios.make_container(str(tmp_path / "c.zarr"), n=20, seed=1, fmt="zarr")
    b = bucket(s3)
    s3.put(local, f"{b}/c.zarr", recursive=True)
    with StallingProxy(endpoint, pattern="/offsets/c/") as proxy:
        for key, value in {"AWS_ENDPOINT_URL": proxy.url, "DSTORE_OBJECT_TIMEOUT": "0.3"}.items():
            monkeypatch.setenv(key, value)
        fsspec.filesystem("s3").clear_instance_cache()
        capsys.readouterr()
        code = main(["verify", f"s3://{b}/c.zarr"])
    fsspec.filesystem("s3").clear_instance_cache()
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert f"s3://{b}/c.zarr" in err and "/offsets/c/0" in err, err
    assert "after no answer within 0.3 s, 3 tries ($DSTORE_OBJECT_TIMEOUT, $DSTORE_OBJECT_TRIES)" in err, err
