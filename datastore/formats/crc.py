"""The container's checksum: CRC32 of a value's bytes (samples and fields alike).

A module of its own, below base.py and fields.py, so that both take it without importing each other.
"""

from __future__ import annotations

try:  # zlib-ng's CRC32: the same values as zlib's, about 5x faster here (SIMD); releases the GIL as zlib's
    from zlib_ng.zlib_ng import crc32 as crc32  # `as`: re-exported (dstore.formats.integrity, dstore.verify)
except ImportError:  # pragma: no cover - a platform without zlib-ng's wheels
    from zlib import crc32 as crc32


def checksum(data) -> int:
    """CRC32 of a sample's bytes (what the `checksums` array stores), as an unsigned 32-bit int."""
    return crc32(memoryview(data).cast("B")) & 0xFFFFFFFF
