"""Types of the optional C extension datastore/codec/_jpegcrop.c (a compiled module has none of its own)."""

from typing import Any

VERSION: int

def decode_region(
    data: Any, out: Any, top: int, left: int, height: int, width: int, denom: int, gray: int, /
) -> tuple[int, int]:
    """Decodes rows top..top+height of a JPEG at 1/denom scale into `out`, the GIL released; returns
    (the decoded rows' width, the region's x offset in them). ValueError names a corrupt file."""
