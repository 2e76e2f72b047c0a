"""Moving a trainer's state between ranks: `torch.save` bytes sent as raw MPI buffers in blocks.

A state of any size crosses: no message is larger than `BLOCK` bytes (an MPI count is a C int, so one
message carries less than 2 GiB), and nothing is pickled by MPI. The receiver reads the bytes with
`torch.load(weights_only=True)`, so a received state can only hold tensors and plain containers: it
runs no code. A small header (length, CRC32) goes first; the CRC is checked on arrival.

Pure part: `blocks` (how a length is cut). The rest is point-to-point over a communicator the
caller passes in.
"""

from __future__ import annotations

import io
import zlib

import numpy as np

BLOCK = 1 << 30
"""Bytes per message (1 GiB, below the 2**31 - 1 elements one MPI count can name)."""
MAX_BLOCK = (1 << 31) - 1


class ExchangeError(RuntimeError):
    """A state arrived damaged (its CRC32 or length differs from what the sender announced)."""


def blocks(length: int, block: int = BLOCK) -> list[tuple[int, int]]:
    """(start, stop) of each message for `length` bytes in messages of at most `block` bytes.

    An empty payload is one empty block (the receiver still gets one message per block in step).
    """
    if not 1 <= block <= MAX_BLOCK:
        raise ValueError(f"block={block} must be in [1, {MAX_BLOCK}] bytes (one MPI message)")
    if length < 0:
        raise ValueError(f"length={length} must be >= 0")
    return [(lo, min(lo + block, length)) for lo in range(0, length, block)] or [(0, 0)]


def pack(state) -> np.ndarray:
    """`state` as torch.save bytes in a uint8 array (a deep copy: shares nothing with live tensors)."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return np.frombuffer(buf.getbuffer(), dtype=np.uint8)


def unpack(data: np.ndarray):
    """Inverse of pack, with torch.load(weights_only=True): tensors and plain containers only.

    Tensors are read onto the host: a state sent from another rank's GPU names a device this rank
    may not have (trainers on one node use different GPUs); load_state_dict copies them where the
    trainer's parameters are.
    """
    import torch

    return torch.load(io.BytesIO(np.ascontiguousarray(data).data), map_location="cpu", weights_only=True)


def _header(data: np.ndarray) -> np.ndarray:
    return np.array([data.size, zlib.crc32(data.data)], dtype=np.int64)


def _check(data: np.ndarray, header: np.ndarray, source: int) -> np.ndarray:
    crc = zlib.crc32(data.data)
    if data.size != int(header[0]) or crc != int(header[1]):
        raise ExchangeError(
            f"the state received from rank {source} is damaged: {data.size} bytes with CRC32 "
            f"{crc:#010x}, announced {int(header[0])} bytes with CRC32 {int(header[1]):#010x}"
        )
    return data


def sendrecv(comm, data: np.ndarray, peer: int, tag: int, *, block: int = 0) -> np.ndarray:
    """Swaps byte arrays with `peer` (which calls this with us as peer); returns what it sent.

    The two payloads may differ in size: the header says how many bytes (so how many blocks) to
    expect, and each step is one `Sendrecv` of a block each way (an empty one where a side has
    finished), so neither side can block the other.

    Args:
        comm: the communicator `peer` is a rank of.
        data: this rank's bytes (uint8, contiguous).
        peer: the partner's rank in comm.
        tag: the message tag (the same on both sides).
        block: bytes per message (0: BLOCK).
    """
    from mpi4py import MPI

    block = block or BLOCK
    head = np.empty(2, dtype=np.int64)
    comm.Sendrecv([_header(data), MPI.INT64_T], peer, tag, [head, MPI.INT64_T], peer, tag)
    out = np.empty(int(head[0]), dtype=np.uint8)
    mine, theirs = blocks(data.size, block), blocks(out.size, block)
    for i in range(max(len(mine), len(theirs))):
        s = data[slice(*mine[i])] if i < len(mine) else data[:0]
        r = out[slice(*theirs[i])] if i < len(theirs) else out[:0]
        comm.Sendrecv([s, MPI.BYTE], peer, tag, [r, MPI.BYTE], peer, tag)
    return _check(out, head, peer)


def send(comm, data: np.ndarray, dest: int, tag: int, *, block: int = 0) -> None:
    """Sends a byte array to `dest` (which calls recv) as a header and blocks of <= `block` bytes."""
    from mpi4py import MPI

    block = block or BLOCK
    comm.Send([_header(data), MPI.INT64_T], dest, tag)
    for lo, hi in blocks(data.size, block):
        comm.Send([data[lo:hi], MPI.BYTE], dest, tag)


def recv(comm, source: int, tag: int, *, block: int = 0) -> np.ndarray:
    """Receives what `send` sent from `source`."""
    from mpi4py import MPI

    block = block or BLOCK
    head = np.empty(2, dtype=np.int64)
    comm.Recv([head, MPI.INT64_T], source, tag)
    out = np.empty(int(head[0]), dtype=np.uint8)
    for lo, hi in blocks(out.size, block):
        comm.Recv([out[lo:hi], MPI.BYTE], source, tag)
    return _check(out, head, source)
