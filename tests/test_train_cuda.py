"""The CUDA path: pinned batches, non-blocking device copies, the CUDA RNG in checkpoints, nccl over
MPI. Run where torch sees a GPU; skipped (not passed) elsewhere."""

import pytest
import torch
from mpi4py import MPI
from support.formats import raw_container

from dstore.loader.store_loader import StoreLoader
from dstore.store.data_store import DataStore
from dstore.training.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch")


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    # rng.integers of shape (8, 8, 3) draws the same 192 bytes as of size 192: the same container.
    return raw_container(tmp_path_factory.mktemp("cuda") / "raw.h5", n=50, shape=(8, 8, 3), seed=7)


def test_pinned_batches_and_device_copies_equal_the_cpu_ones(container):
    with DataStore(MPI.COMM_SELF, container, batch_size=8, seed=1) as st:
        with StoreLoader(st) as ld:
            cpu = [(x.clone(), y.clone()) for x, y in ld.epoch(0)]
        with StoreLoader(st, pin_memory=True) as ld:
            pinned = list(ld.epoch(0))
        assert all(x.is_pinned() for x, _ in pinned)
        with StoreLoader(st, pin_memory=True, device="cuda") as ld:
            on_gpu = []
            for x, y in ld.epoch(0):
                assert x.device.type == "cuda" and y.device.type == "cuda"
                on_gpu.append((x.float().sum().item(), y.cpu()))  # work on the caller's stream
        for (x, y), (s, y2) in zip(cpu, on_gpu):
            assert float(x.float().sum()) == s and torch.equal(y, y2)


def test_cuda_rng_state_survives_a_checkpoint(tmp_path):
    torch.cuda.manual_seed(123)
    torch.rand(4, device="cuda")
    state = rng_state()
    assert state["cuda"] is not None
    want = torch.rand(8, device="cuda").cpu()
    path = save_checkpoint(tmp_path / "ck.pt", {"rng": [state]})
    torch.cuda.manual_seed(999)
    set_rng_state(load_checkpoint(path)["rng"][0])
    assert torch.equal(torch.rand(8, device="cuda").cpu(), want)


def test_nccl_group_over_mpi_on_one_rank():
    from dstore.training.dist import init_distributed

    with init_distributed(MPI.COMM_SELF, "cuda") as ctx:
        assert ctx.backend == "nccl" and ctx.device.type == "cuda"
        t = torch.ones(3, device=ctx.device)
        torch.distributed.all_reduce(t, group=ctx.group)
        assert t.sum().item() == 3.0
