"""`dstore pfs`: a parallel-file-system model (latency, shared iops and bandwidth, no page cache) as a FUSE file system."""

from dstore.tools.pfs.model import DEFAULTS, PfsModel, parse_bandwidth, parse_rate, parse_spec, parse_time
from dstore.tools.pfs.mount import (
    PfsMount,
    PfsMountError,
    StaleMountError,
    force_unmount,
    fuse_available,
    pfs_mount,
    stale_mounts,
    unmount_command,
)

__all__ = [
    "DEFAULTS",
    "PfsModel",
    "PfsMount",
    "PfsMountError",
    "StaleMountError",
    "force_unmount",
    "fuse_available",
    "parse_bandwidth",
    "parse_rate",
    "parse_spec",
    "parse_time",
    "pfs_mount",
    "stale_mounts",
    "unmount_command",
]
