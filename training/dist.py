"""torch.distributed bootstrapped from an MPI communicator: one process group per communicator.

Each process joins exactly one torch process group, formed over the communicator it is given
(``COMM_WORLD`` for plain data-parallel training, a trainer's sub-communicator under LTFB). Rank 0
of that communicator starts a ``TCPStore`` on a free port of its host and broadcasts the address
over MPI, so no environment variables or torchrun are needed, and several communicators in one MPI
job (K trainers x M ranks) each get their own store and group without knowing of each other. The
group is handed to the trainer explicitly (``DistContext.group``); nothing reads a global.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import gc
import socket
from typing import Any, Literal

from dstore.errors import ConfigError
from dstore.runtime import job
from dstore.runtime.collective import topology
from dstore.runtime.job import launcher_mismatch as launcher_mismatch  # re-exported

DEVICES = ("cpu", "cuda")
_collect_at_exit = False


def _collect_before_finalize() -> None:
    """Frees unreachable objects (a DDP wrapper and its torch process group are often in a
    reference cycle) while the interpreter and MPI are still whole. Python's atexit handlers run at
    the start of interpreter shutdown, before the collection inside finalization and before
    MPI_Finalize (mpi4py's Py_AtExit, at the very end). Left to that late collection, a gloo group
    was destroyed mid-shutdown and one of its worker threads aborted the process: about 1 run in 3
    of the 2-rank example ended with "terminate called without an active exception" (signal 6)
    after printing its result; 0 in 20 with this handler."""
    gc.collect()


def _free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _rendezvous_host() -> str:
    """This host's name if it resolves to an address, else an address of one of its network interfaces
    (`_own_interface`), else 127.0.0.1: the other ranks must reach it, and on another node a loopback
    address is that node's own (an emulated node whose name resolved nowhere waited 300 s for nothing)."""
    if _resolves(socket.gethostname()):
        return socket.gethostname()
    found = _own_interface()
    return found[1] if found else "127.0.0.1"


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def _own_interface() -> tuple[str, str] | None:
    """(name, IPv4 address) of this host's first network interface other than loopback that has one
    (Linux: SIOCGIFADDR), or None."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address, or down
            addr = socket.inet_ntoa(packed[20:24])
            if not addr.startswith("127."):
                return name, addr
    return None


def _gloo_interface() -> None:
    """Points gloo at a real interface where this host's name does not resolve: gloo binds what the
    name resolves to and falls back to loopback otherwise, which no other node can reach. An explicit
    $GLOO_SOCKET_IFNAME is kept."""
    import os

    if "GLOO_SOCKET_IFNAME" in os.environ or _resolves(socket.gethostname()):
        return
    found = _own_interface()
    if found:
        os.environ["GLOO_SOCKET_IFNAME"] = found[0]


@dataclasses.dataclass
class DistContext:
    """Who-am-I for one trainer: its MPI communicator, its torch process group and its device.

    Attributes:
        comm: the MPI communicator the group was formed over (not owned; the caller frees it).
        rank: this process's rank in `comm` and in `group`.
        size: number of ranks in `comm`.
        local_rank: rank among the processes of `comm` on this node (selects the GPU).
        local_size: number of processes of `comm` on this node.
        device: the torch.device the model lives on.
        backend: "gloo" or "nccl".
        group: the torch.distributed process group over `comm`; pass it to DDP and collectives.
    """

    comm: Any
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: Any
    backend: str
    group: Any = None
    _owns_group: bool = dataclasses.field(default=False, repr=False)
    _store: Any = dataclasses.field(default=None, repr=False)
    _job: Any = dataclasses.field(default=None, repr=False)  # its hold on dstore.runtime.job's aborting hook

    @property
    def is_main(self) -> bool:
        """True on the rank that prints, logs and writes checkpoints."""
        return self.rank == 0

    def close(self) -> None:
        """Destroys the process group if this context created it. Safe to call twice."""
        self._end_group()
        if self._job is not None:
            self._job.release()

    def _end_group(self) -> None:
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False
        self.group = None
        self._store = None

    def __enter__(self) -> DistContext:
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        # With an exception on its way up, the group stays (the other ranks' collectives in it
        # would fail at once with "connection closed", printed before this rank's own error), and so
        # does the hook that aborts the job when the exception arrives.
        if exc_type is None:
            self.close()
        return False


def init_distributed(
    comm, device: str = "cpu", *, timeout_s: float = 300.0, gpu_index: int | None = None
) -> DistContext:
    """Forms a torch.distributed process group over `comm` (collective over `comm`).

    Args:
        comm: any mpi4py intracommunicator; every rank of it must call this.
        device: "cpu" (gloo backend) or "cuda" (nccl, one GPU per rank chosen by node-local rank).
        timeout_s: how long collectives and the rendezvous may wait before failing.
        gpu_index: with cuda, the GPU this rank drives (default: its node-local rank in `comm`).
            Several trainers sharing a node (LTFB) pass the node-local rank over the whole job,
            so that they use different GPUs.

    Returns:
        A DistContext; close it (or use it as a context manager) to destroy the group.

    Raises:
        ConfigError: for an unknown device, a missing GPU, or a process that already belongs to a
            different torch process group.
    """
    import torch.distributed as dist

    if device not in DEVICES:
        raise ConfigError(f"device={device!r} is not one of {DEVICES}")
    held = job.arm()  # torchrun refused; an uncaught exception aborts the job while the group is open
    _collect_groups_before_finalize()
    rank, size = comm.Get_rank(), comm.Get_size()
    here = topology(comm)  # the machine's real nodes (GPUs are per machine), never $DSTORE_RANKS_PER_NODE's
    torch_device, backend = _device_of(device, here.local_rank, gpu_index)
    if dist.is_initialized():
        # One torch group per process: reuse it if it is this communicator's shape, else refuse
        # rather than silently training with the wrong peers.
        if dist.get_rank() == rank and dist.get_world_size() == size:
            return DistContext(
                comm,
                rank,
                size,
                here.local_rank,
                here.local_size,
                torch_device,
                dist.get_backend(),
                group=dist.group.WORLD,
                _job=held,
            )
        raise ConfigError(
            f"this process already belongs to a torch process group of size {dist.get_world_size()} "
            f"(rank {dist.get_rank()}); cannot form another over a communicator of size {size}"
        )
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _rendezvous(comm, timeout)
    if backend == "gloo":
        _gloo_interface()
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    job.reassert()  # torch installs its own excepthook over ours: see job.reassert
    return DistContext(
        comm,
        rank,
        size,
        here.local_rank,
        here.local_size,
        torch_device,
        backend,
        group=dist.group.WORLD,
        _owns_group=True,
        _store=store,
        _job=held,
    )


def _collect_groups_before_finalize() -> None:
    """Registers (once) the atexit handler that collects torch groups while MPI is still whole."""
    global _collect_at_exit
    if not _collect_at_exit:
        atexit.register(_collect_before_finalize)  # atexit runs handlers last-registered first
        _collect_at_exit = True


def _device_of(device: str, local_rank: int, gpu_index: int | None):
    """(torch.device, backend) of this rank: the CPU with gloo, or its GPU (`gpu_index`, else its
    node-local rank), made current, with nccl."""
    import torch

    if device != "cuda":
        return torch.device("cpu"), "gloo"
    if not torch.cuda.is_available():
        raise ConfigError("device='cuda' was asked for but torch sees no CUDA GPU; use device='cpu'")
    ngpu = torch.cuda.device_count()
    gpu = local_rank if gpu_index is None else int(gpu_index)
    if not 0 <= gpu < ngpu:
        from mpi4py import MPI  # only here: to name the job's rank in the error

        whose = "its node-local rank" if gpu_index is None else "its node-local rank in the whole job"
        raise ConfigError(  # the job's rank: in a trainer of LTFB, the communicator's rank would be the trainer's
            f"rank {MPI.COMM_WORLD.Get_rank()} would drive GPU {gpu} ({whose}) but this node has only "
            f"{ngpu} GPU(s); start at most {ngpu} ranks per node"
        )
    torch.cuda.set_device(gpu)
    return torch.device("cuda", gpu), "nccl"


def _rendezvous(comm, timeout):
    """The TCPStore every rank of `comm` meets at: hosted by rank 0 on a free port (collective).
    A port can be taken between picking and binding, so rank 0 tries up to 5 ports."""
    # torch.distributed.TCPStore, from the module that defines it: torch.distributed re-exports it
    # without marking it public, so a type checker reads the name there as private
    from torch._C._distributed_c10d import TCPStore

    rank, size = comm.Get_rank(), comm.Get_size()
    err, store = None, None
    for _ in range(5):
        addr = (_rendezvous_host(), _free_port()) if rank == 0 else None
        host, port = comm.bcast(addr, root=0)
        err = None
        if rank == 0:
            try:
                store = TCPStore(host, port, size, True, timeout=timeout, wait_for_workers=False)
            except (RuntimeError, OSError) as exc:
                err = f"{type(exc).__name__}: {exc}"
        err = comm.bcast(err, root=0)
        if err is None:
            break
    else:
        raise ConfigError(f"rank 0 could not start the rendezvous store after 5 tries: {err}")
    if rank == 0 and store is not None:  # always on rank 0 here: err is None
        return store
    return TCPStore(host, port, size, False, timeout=timeout)


def torch_env(comm) -> dict[str, str]:
    """The environment a torchrun-style library reads to join a process group (collective over
    `comm`): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_ADDR/MASTER_PORT (rank 0's
    host and a port free there a moment ago). For HF Accelerate (or anything that calls
    `init_process_group(init_method="env://")`) under `mpiexec`, which sets none of them:
    `os.environ.update(torch_env(MPI.COMM_WORLD))` before it starts."""
    here = topology(comm)
    addr = (_rendezvous_host(), _free_port()) if comm.Get_rank() == 0 else None
    host, port = comm.bcast(addr, root=0)
    return {
        "RANK": str(comm.Get_rank()),
        "WORLD_SIZE": str(comm.Get_size()),
        "LOCAL_RANK": str(here.local_rank),
        "LOCAL_WORLD_SIZE": str(here.local_size),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
    }
