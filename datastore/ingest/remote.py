"""Sources in object storage (`s3://bucket/prefix`, `gs://...`, any fsspec URL), read through fsspec
(an optional dependency: `pip install 'dstore-mpi[object]'` brings fsspec and s3fs).

Credentials and the endpoint come from the environment, as the AWS tools read them
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`,
`AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` for MinIO, Ceph or another
S3-compatible server); nothing is passed on the command line. A `Remote` holds only the URL's
protocol, so it pickles: rank 0 lists the prefix once and broadcasts the source, and each rank makes
its own connection when it first reads.

How it reads: a prefix is listed once (one recursive listing, `find`); small metadata files
(`state.json`...) are read whole; a file read from start to end (a tar shard's headers while
listing) is read as a stream in blocks of READ_BLOCK bytes; a sample is one ranged GET of exactly
its bytes. Every failure of the store (no such bucket or key, no permission, no connection) is a
SampleError of one line naming the URL.
"""

from __future__ import annotations

import re

from dstore.errors import ConfigError, SampleError, shown
from dstore.formats.objects import bounded_filesystem, first_line, waited
from dstore.runtime import rc

READ_BLOCK = 16 << 20
"""Bytes fetched per request when a file is read as a stream (S3 charges per request, and each has
tens of ms of latency: 16 MiB keeps a shard's listing near the link's bandwidth)."""

_PACKAGES = {
    "s3": "fsspec and s3fs: pip install 'dstore-mpi[object]'",
    "s3a": "fsspec and s3fs: pip install 'dstore-mpi[object]'",
    "gs": "gcsfs: pip install gcsfs",
    "gcs": "gcsfs: pip install gcsfs",
    "az": "adlfs: pip install adlfs",
    "abfs": "adlfs: pip install adlfs",
}
"""What to install for a protocol whose package is missing (fsspec's own message names only the package)."""

_URL = re.compile(r"^(?P<protocol>[A-Za-z][A-Za-z0-9+.-]*)://")


def is_url(spec: str) -> bool:
    """Whether `spec` is an object-store URL (`s3://...`), not a local path (`file://` is local)."""
    m = _URL.match(str(spec))
    return m is not None and m.group("protocol").lower() not in ("file", "local")


def _reason(exc: BaseException, s3: bool = True) -> str:
    """What went wrong, for a one-line message (the store's libraries raise many types)."""
    if isinstance(exc, FileNotFoundError):
        return f"does not exist (no such bucket or key; {first_line(exc)})"
    if isinstance(exc, PermissionError):
        check = "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" if s3 else "the store's credentials"
        return f"permission denied (check {check} or the bucket policy; {first_line(exc)})"
    return first_line(exc) + waited(exc)


class Prefetched:
    """Samples fetched ahead for `load` (Source.prefetch): {source index: bytes or its SampleError},
    each taken once. Not pickled: fetched bytes stay with the rank that asked for them."""

    def __init__(self):
        self._got: dict[int, bytes | SampleError] = {}

    def __getstate__(self):
        return {"_got": {}}

    def fill(self, remote: Remote, indices, where) -> None:
        """Fetches (url, start, end) = where(i) for each index, concurrently, replacing what was held."""
        indices = list(indices)
        self._got = dict(zip(indices, remote.read_many([where(i) for i in indices])))

    def take(self, i: int) -> bytes | None:
        """Sample i's prefetched bytes (once), or None if it was not prefetched.

        Raises:
            SampleError: its fetch failed (naming the URL).
        """
        got = self._got.pop(i, None)
        if isinstance(got, SampleError):
            raise got
        return got


def failure(url: str, what: str, exc: BaseException) -> SampleError:
    """The one-line error for a store operation `what` (`list`, `read`) on `url` that raised `exc`."""
    s3 = url.lower().startswith(("s3://", "s3a://"))
    return SampleError(f"{shown(url)}: cannot {what}: {shown(_reason(exc, s3))}")


class Remote:
    """One object store's file system, opened lazily in each process (picklable).

    Args:
        url: any URL of the store (its protocol picks the fsspec implementation).

    Raises:
        ConfigError: fsspec, or the package for the protocol (s3fs, gcsfs...), is not installed.
    """

    def __init__(self, url: str):
        m = _URL.match(url)
        if m is None:
            raise ConfigError(f"source {url!r} is not a URL (protocol://bucket/prefix)")
        self.protocol = m.group("protocol").lower()
        self._fs = None
        self.fs  # noqa: B018 - fails here, on the rank that lists, if the package is missing

    def __getstate__(self):
        return {"protocol": self.protocol, "_fs": None}  # each process makes its own connection

    @property
    def fs(self):
        """The fsspec file system (made on first use in this process)."""
        if self._fs is None:
            try:
                self._fs = bounded_filesystem(self.protocol)
            except ImportError as exc:
                hint = _PACKAGES.get(self.protocol, "the fsspec implementation of this protocol")
                raise ConfigError(f"reading {self.protocol}:// sources needs {hint} ({exc})") from None
            except ValueError as exc:  # fsspec: unknown protocol
                raise ConfigError(f"{self.protocol}:// is not a protocol fsspec knows: {exc}") from None
        return self._fs

    def url(self, path: str) -> str:
        """The URL of a store path (`bucket/key` -> `s3://bucket/key`)."""
        return path if _URL.match(path) else f"{self.protocol}://{path}"

    def path(self, url: str) -> str:
        """The store path of a URL (`s3://bucket/key/` -> `bucket/key`)."""
        return self.fs._strip_protocol(url).rstrip("/")

    def _call(self, what: str, url: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SampleError, ConfigError):
            raise
        except Exception as exc:  # botocore, aiohttp and fsspec raise many types; name the URL
            raise failure(url, what, exc) from exc

    def listing(self, url: str) -> dict[str, int]:
        """{path relative to `url`: size} of every object below the prefix `url` (one recursive listing).

        Raises:
            SampleError: naming `url` if the store cannot be listed (no bucket, no permission, no connection).
        """
        root = self.path(url)
        found = self._call("list", url, self.fs.find, root, detail=True)
        out = {}
        for name, info in sorted(found.items()):
            name = name.rstrip("/")
            if info.get("type") == "directory" or not name.startswith(root + "/"):
                continue
            out[name[len(root) + 1 :]] = int(info.get("size") or 0)
        return out

    def size(self, url: str) -> int | None:
        """The size of the object `url`, or None if there is none.

        Raises:
            SampleError: naming `url` if the store cannot be asked (no bucket, no permission, no connection).
        """
        try:
            info = self.fs.info(self.path(url))
        except FileNotFoundError:
            return None
        except Exception as exc:  # botocore, aiohttp and fsspec raise many types; name the URL
            raise failure(url, "read", exc) from exc
        return None if info.get("type") == "directory" else int(info.get("size") or 0)

    def glob(self, url: str) -> list[str]:
        """The URLs of the objects matching the glob `url`, sorted."""
        return sorted(self.url(p) for p in self._call("list", url, self.fs.glob, self.path(url)))

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes [start, end) of `url` in one request (the whole object without start and end)."""
        return self._call("read", url, self.fs.cat_file, self.path(url), start=start, end=end)

    def read_many(self, ranges: list[tuple[str, int | None, int | None]]) -> list[bytes | SampleError]:
        """Bytes [start, end) of each (url, start, end), fetched concurrently (one request each, many in
        flight: a rank's samples of a chunk arrive in about one round trip, not one per sample); a
        range that fails is its one-line SampleError in the list, so that only that sample is bad."""
        if not ranges:
            return []
        paths = [self.path(u) for u, _, _ in ranges]
        # In flight: no more than the pool's connections (an async store's; a sync one reads in turn), so
        # that no request of ours waits for one of the pool, a wait bounded as a failure (objects.storage_options).
        more = {"batch_size": rc.OBJECT_CONNECTIONS.get()} if getattr(self.fs, "async_impl", False) else {}
        try:
            got = self.fs.cat_ranges(
                paths, [a for _, a, _ in ranges], [b for _, _, b in ranges], on_error="return", **more
            )
        except Exception as exc:  # noqa: BLE001 - the batch failed (no connection): every sample gets the reason
            return [failure(u, "read", exc) for u, _, _ in ranges]
        return [g if isinstance(g, bytes) else failure(u, "read", g) for (u, _, _), g in zip(ranges, got)]

    def read_text(self, url: str) -> str:
        """A small text object (a JSON listing), read whole."""
        return self.read(url).decode("utf-8")

    def open(self, url: str, cache: bool = True):
        """`url` as a seekable binary file: read ahead in READ_BLOCK requests (for reading it start to
        end), or with `cache=False` one request per read of exactly what is asked (for a reader that
        asks for whole column chunks, as pyarrow does)."""
        if cache:
            return self._call(
                "open", url, self.fs.open, self.path(url), "rb", block_size=READ_BLOCK, cache_type="readahead"
            )
        return self._call("open", url, self.fs.open, self.path(url), "rb", cache_type="none")
