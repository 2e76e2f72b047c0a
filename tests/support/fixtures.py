"""Small file systems the tests build for themselves: a tmpfs mounted read-only or with a size limit."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on the new directory `mnt` with `-o options` ("ro,size=1m": writes fail with
    EROFS; "size=100k": with ENOSPC), unmounted on exit.

    Skips the test, with mount's own reason, where this process may not mount (no root, a container).
    """
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs -o {options} here: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
