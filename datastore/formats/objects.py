"""Containers in object storage (`s3://bucket/key.h5`, any fsspec URL): one object read with ranged
requests, pinned to the version the job opened.

A container file in a bucket is read as a local one is, through a `RangeFile` (positioned reads,
its identity, `dup`): `LocalFile` over a descriptor (os.preadv), `ObjectFile` over an object. What
a read asks for is what one request fetches: no read-ahead cache, no block rounding (fsspec's
default file reads 5 MiB blocks ahead, which for a random sample read is 50x the bytes asked for).
The callers choose the sizes: HDF5's metadata in aligned blocks of META_BLOCK bytes (a few requests
to open a file), the data as the store's coalesced runs (dstore.order.tiers.plan_storage: one request per
run of consecutive samples) and the preload's pieces (dstore.store.preload).

An object is pinned at open by its ETag (and size, modification time): each thread reads through
its own fsspec file, whose requests carry ``If-Match: <ETag>`` (s3fs), so an object replaced while
the job reads it fails the next request with ContainerChangedError naming the URL, never serves
bytes of another version. A thread's file that opens another version is refused the same way.

Every wait on the store is bounded (storage_options): a request that gets no connection (a free one
of the pool of $DSTORE_OBJECT_CONNECTIONS, then the connect: dstore.formats.s3session), or no answer,
within $DSTORE_OBJECT_TIMEOUT seconds is tried again, $DSTORE_OBJECT_TRIES times in all with a
backoff, and then fails with one line naming the URL and that wait (`waited`). The tries are
botocore's, once per request; s3fs's own are off, since s3fs nests two loops of them around
botocore's (a read that never answered was sent tries^2 x 2 times: 18 requests of 10 s for a line
saying "10 s, 3 tries"). A read whose answer stops mid-way is tried again by `ObjectFile.pread_into`
(botocore has returned by then).

A request that timed out gives its connection back (aiohttp closes it), except in s3fs's concurrent
read of a whole object past its 50 MiB block (`_cat_file_concurrent`): a range whose answer stopped
is never closed, and its connection stays taken for good (2 per failure: five such failures drained
the pool of 10, and every later request waited for it without end). Our file systems read a whole
object as one request (s3fs's `max_concurrency=1`), closed on every path.

Credentials and the endpoint come from the environment as the AWS tools read them
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_DEFAULT_REGION,
AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL), or fsspec's configuration; each process (each rank) makes
its own connection.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import threading
import time

from dstore.errors import ConfigError, ContainerChangedError, ContainerNotFoundError, FormatError, shown
from dstore.runtime import rc

_URL = re.compile(r"^(?P<protocol>[A-Za-z][A-Za-z0-9+.-]*)://")

_COUNT_LOCK = threading.Lock()

OBJECT = "object"
"""The second entry of an object's identity (where a file's has its device number)."""


def is_url(path) -> bool:
    """Whether `path` is an object-store URL (`s3://...`), not a local path (`file://` is local)."""
    m = _URL.match(str(path))
    return m is not None and m.group("protocol").lower() not in ("file", "local")


def storage_options(protocol: str) -> dict:
    """The options every fsspec file system of ours is made with (ours, an ingest's, Zarr's): for S3
    the bounded waits of the module docstring; {} for other protocols (their own defaults)."""
    if protocol.lower() not in ("s3", "s3a"):
        return {}
    from dstore.formats.s3session import BoundedAIOHTTPSession

    timeout = rc.OBJECT_TIMEOUT.get()
    return {
        "config_kwargs": {
            "connect_timeout": timeout,
            "read_timeout": timeout,
            # total_max_attempts counts the first request (botocore's max_attempts does not: 1 was 2 tries).
            # Legacy mode: its tries are always these; standard mode's stop once a quota is spent (50 timeouts).
            "retries": {"total_max_attempts": rc.OBJECT_TRIES.get(), "mode": "legacy"},
            "max_pool_connections": rc.OBJECT_CONNECTIONS.get(),
            "http_session_cls": BoundedAIOHTTPSession,  # bounds the wait for a pooled connection too
        },
        # A whole object past 50 MiB as one request, not s3fs's concurrent ranges, whose bodies it leaves
        # open when one times out: each such failure kept 2 connections of the pool for good (module docstring).
        "max_concurrency": 1,
    }


def bounded_filesystem(protocol: str, **extra):
    """fsspec's file system of `protocol` made with `storage_options` (and `extra`, as Zarr adds
    `asynchronous=True`), s3fs's own tries set to 1 (an attribute, not an argument; botocore's are the
    tries: module docstring). fsspec caches instances by their arguments, so Zarr's store, opened with
    the same ones, gets this instance."""
    import fsspec

    fs = fsspec.filesystem(protocol, **storage_options(protocol), **extra)
    if protocol.lower() in ("s3", "s3a"):
        fs.retries = 1
    return fs


_BODY_FAILED = ("AioReadTimeoutError", "ClientPayloadError", "IncompleteReadError", "ResponseStreamingError")
"""Errors of an answer that stopped mid-way (raised after botocore returned, so not tried by it)."""


def _chain(exc: BaseException):
    """`exc` and what it was raised from (or during), innermost last (at most 8)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def underlying(exc: BaseException) -> BaseException:
    """The error to name for `exc`: fsspec's FSTimeoutError has no text (its cause has), and s3fs's
    S3File turns it into `IndexError: tuple index out of range` (its `ex.args[0]` of an OSError
    without args): for those, the timeout that caused them."""
    for seen in _chain(exc):
        inner = seen.__cause__ or seen.__context__
        wrapper = type(seen).__name__ == "FSTimeoutError" or (
            isinstance(seen, IndexError) and isinstance(inner, OSError)
        )
        if inner is None or not wrapper:
            return seen
    return exc


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message` of `underlying(exc)`."""
    exc = underlying(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def waited(exc: BaseException) -> str:
    """ ", after no answer within N s, K tries ($DSTORE_OBJECT_TIMEOUT, $DSTORE_OBJECT_TRIES)" where
    `exc` (or what it was raised from) is a timeout or a connection that could not be made, else ""."""
    for seen in _chain(exc):
        name = type(seen).__name__
        if "Timeout" in name or "EndpointConnectionError" in name or isinstance(seen, (TimeoutError, ConnectionError)):
            return (
                f", after no answer within {rc.OBJECT_TIMEOUT.get():g} s, {rc.OBJECT_TRIES.get()} tries "
                f"(${rc.OBJECT_TIMEOUT.name}, ${rc.OBJECT_TRIES.name})"
            )
    return ""


def filesystem(url: str):
    """The fsspec file system of `url`'s protocol with our `storage_options`, made once per process
    (fsspec's instance cache).

    Raises:
        ConfigError: fsspec or the protocol's package (s3fs...) is not installed.
    """
    m = _URL.match(url)
    if m is None:
        raise ConfigError(f"{shown(url)} is not a URL (protocol://...)")
    protocol = m.group("protocol").lower()
    try:
        return bounded_filesystem(protocol)
    except ImportError as exc:
        hint = (
            "fsspec and s3fs: pip install 'dstore-mpi[object]'"
            if protocol in ("s3", "s3a")
            else "the fsspec implementation of this protocol"
        )
        raise ConfigError(f"reading {protocol}:// containers needs {hint} ({exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{protocol}:// is not a protocol fsspec knows: {exc}") from None


def join(base: str, *parts: str) -> str:
    """`base` and `parts` joined with "/" (a URL's or a path's separator, as `base` has it)."""
    return posixpath.join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def _reason(exc: BaseException) -> str:
    first = first_line(exc)
    if isinstance(exc, PermissionError):
        return f"permission denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the bucket policy; {first})"
    return first + waited(exc)


def stat(url: str) -> dict | None:
    """The object `url`'s {"size", "etag", "mtime"} as the store says now (one HEAD request, never a
    cached listing), or None if there is no object (a prefix is none).

    Raises:
        FormatError: the store cannot be asked (no bucket permission, no connection), naming `url`.
    """
    fs = filesystem(url)
    path = fs._strip_protocol(url)
    try:
        fs.invalidate_cache(path)
        info = fs.info(path)
    except FileNotFoundError:
        return None
    except Exception as exc:  # botocore, aiohttp and fsspec raise many types; name the URL
        raise FormatError(f"{shown(url)}: cannot read: {shown(_reason(exc))}") from exc
    if info.get("type") == "directory":
        return None
    mtime = info.get("LastModified") or info.get("mtime") or info.get("updated")
    return {
        "size": int(info.get("size") or 0),
        "etag": info.get("ETag") or info.get("etag"),
        "mtime": str(mtime) if mtime is not None else None,
    }


def object_identity(url: str) -> tuple:
    """(url, OBJECT, ETag, size, modification time) of the object now, or (url, None, None, None,
    None) where there is none: the shape of dstore.formats.base.file_identity, compared alike.
    A URL ending in "/" is a prefix (a Zarr array's chunk objects): its ETag is a digest of every
    object's key, ETag and size below it (one listing), its size their total bytes."""
    if url.endswith("/"):
        return _prefix_identity(url)
    st = stat(url)
    if st is None:
        return (url, None, None, None, None)
    return (url, OBJECT, st["etag"], st["size"], st["mtime"])


def list_below(url: str, what: str = "cannot list") -> tuple[str, dict[str, dict]]:
    """Every object below the prefix `url`, listed afresh (fsspec's listing cache dropped first):
    (the prefix as the file system names it, {key: its listing entry}).

    Raises:
        FormatError: the store cannot be asked; `what` and the reason, naming `url`.
    """
    fs = filesystem(url)
    root = fs._strip_protocol(url).rstrip("/")
    try:
        fs.invalidate_cache(root)
        return root, fs.find(root, detail=True)
    except Exception as exc:  # botocore, aiohttp and fsspec raise many types; name the URL
        raise FormatError(f"{shown(url)}: {what}: {shown(_reason(exc))}") from exc


def _prefix_identity(url: str) -> tuple:
    _root, found = list_below(url)
    if not found:
        return (url, None, None, None, None)
    digest = hashlib.sha256()
    for key in sorted(found):
        info = found[key]
        digest.update(f"{key}\0{info.get('ETag') or info.get('etag')}\0{info.get('size')}\n".encode())
    return (
        url,
        OBJECT,
        f"{len(found)} objects, digest {digest.hexdigest()[:16]}",
        sum(int(i.get("size") or 0) for i in found.values()),
        None,
    )


def read_object(url: str) -> bytes:
    """A small object (a manifest) read whole.

    Raises:
        FileNotFoundError: no such object. FormatError: the store cannot be asked, naming `url`.
    """
    fs = filesystem(url)
    try:
        return fs.cat_file(fs._strip_protocol(url))
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise FormatError(f"{shown(url)}: cannot read: {shown(_reason(exc))}") from exc


class LocalFile:
    """A local file read with os.preadv (releases the GIL; threads may share it)."""

    def __init__(self, path: str, fd: int | None = None):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)) if fd is None else fd
        self.size = os.fstat(self.fd).st_size

    def pread_into(self, view: memoryview, at: int) -> int:
        """Reads into `view` from byte `at`; the bytes read (fewer at the end of the file)."""
        return os.preadv(self.fd, [view], at)

    def identity(self) -> tuple:
        return local_identity(self.path, self.fd)

    def dup(self) -> LocalFile:
        """Another handle on the very file opened (a duplicate descriptor), closed separately."""
        return LocalFile(self.path, os.dup(self.fd))

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def local_identity(path: str, fd: int | None = None) -> tuple:
    """(path, st_dev, st_ino, st_size, st_mtime_ns) of a local file or directory (of the open file
    `fd` where given), or (path, None, None, None, None) where it is gone (base.file_identity)."""
    try:
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError:
        return (path, None, None, None, None)
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class ObjectFile:
    """An object read with ranged requests, pinned to the version opened (see the module docstring).

    Args:
        url: the object's URL.
        pinned: the identity to hold it to (`dup`); None: the object as it is now (one HEAD request).

    Raises:
        ContainerNotFoundError: no object at `url`.
        ContainerChangedError: `pinned` given and the object is another version now.
    """

    total_requests = 0
    """Ranged requests made by every ObjectFile of this process (for measurements)."""
    total_bytes = 0
    """Bytes they fetched."""

    def __init__(self, url: str, pinned: tuple | None = None):
        self.path = url
        self.fs = filesystem(url)
        self._key = self.fs._strip_protocol(url)
        if pinned is None:
            pinned = object_identity(url)
            if pinned[1] is None:
                raise ContainerNotFoundError(f"{shown(url)}: no such object (check the bucket and the key)")
        self._pinned = pinned
        self.size = int(pinned[3])
        self._local = threading.local()
        self._files: list = []
        self._lock = threading.Lock()
        self.requests = 0
        """Ranged requests made (the metadata's blocks and the data's runs), for the measurements."""

    def _file(self):
        f = getattr(self._local, "file", None)
        if f is None:
            try:
                # cache_type "none": each read is one request for exactly its bytes (module docstring).
                f = self.fs.open(self._key, "rb", cache_type="none")
            except FileNotFoundError:
                raise self._changed("it is gone") from None
            except Exception as exc:
                raise FormatError(f"{shown(self.path)}: cannot open: {shown(_reason(exc))}") from exc
            details = getattr(f, "details", {}) or {}
            etag, size = details.get("ETag") or details.get("etag"), details.get("size")
            if (etag is not None and etag != self._pinned[2]) or (size is not None and int(size) != self.size):
                f.close()
                raise self._changed(f"ETag {self._pinned[2]} -> {etag}, size {self.size} -> {size}")
            with self._lock:
                self._files.append(f)
            self._local.file = f
        return f

    def _changed(self, what: str) -> ContainerChangedError:
        return ContainerChangedError(
            f"{shown(self.path)}: the container changed while this job was reading it "
            f"({what}); a container must not be rewritten while a job reads it"
        )

    def pread_into(self, view: memoryview, at: int) -> int:
        """Reads into `view` from byte `at` with one ranged request; the bytes read (fewer at the end)."""
        n = min(len(view), max(0, self.size - at))
        if n <= 0:
            return 0
        got = self._read(self._file(), at, n)
        with self._lock:
            self.requests += 1
        with _COUNT_LOCK:
            ObjectFile.total_requests += 1
            ObjectFile.total_bytes += len(got)
        view[: len(got)] = got
        return len(got)

    def _read(self, f, at: int, n: int) -> bytes:
        """Bytes [at, at + n) read with one ranged request; asked again where the answer stopped mid-way
        (module docstring), $DSTORE_OBJECT_TRIES times in all."""
        tries, k = rc.OBJECT_TRIES.get(), 0
        while True:
            try:
                f.seek(at)
                return f.read(n)
            except FileNotFoundError:
                raise self._changed("it is gone") from None
            except Exception as exc:  # botocore, aiohttp, fsspec, and s3fs's IndexError (`underlying`)
                if type(exc).__name__ == "FileExpired" or "pre-condition" in str(exc).lower():
                    raise self._changed("another version: its ETag no longer matches") from None
                k += 1
                if k >= tries or not any(type(e).__name__ in _BODY_FAILED for e in _chain(exc)):
                    reason = shown(_reason(exc))
                    raise FormatError(f"{shown(self.path)}: cannot read bytes [{at}, {at + n}): {reason}") from exc
            time.sleep(min(0.1 * 2 ** (k - 1), 2.0))

    def identity(self) -> tuple:
        """The identity the object was pinned to (what every read is held to)."""
        return self._pinned

    def dup(self) -> ObjectFile:
        """Another handle on the same version (its own connection's files), closed separately."""
        return ObjectFile(self.path, self._pinned)

    def close(self) -> None:
        with self._lock:
            files, self._files = self._files, []
        for f in files:
            try:
                f.close()
            except Exception:  # noqa: BLE001 - a read-only file: nothing is lost
                pass


def open_file(path: str) -> LocalFile | ObjectFile:
    """The file or object at `path` opened for positioned reads."""
    return ObjectFile(path) if is_url(path) else LocalFile(path)
