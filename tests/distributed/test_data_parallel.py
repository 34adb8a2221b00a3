"""DataParallel over StoreCommunicator in 2 real processes equals single-process training on the full batch."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import nn
from flowgraph.distributed.comm import Communicator
from flowgraph.errors import FlowError

from ._util import free_port


def _two_gpus() -> bool:
    return sum(d.startswith("cuda") for d in fg.available_devices()) >= 2


#: Both transports: the store on CPU processes everywhere, NCCL where two GPUs are visible.
BACKENDS = pytest.mark.parametrize("backend", [
    "local",
    pytest.param("nccl", marks=pytest.mark.skipif(not _two_gpus(), reason="NCCL needs two CUDA devices here")),
])


def _launch_two(worker: str, tmp_path, backend: str) -> None:
    """Run ``worker`` on 2 ranks through the launcher (it writes ``res.<rank>`` into ``tmp_path``)."""
    res = subprocess.run([sys.executable, "-m", "flowgraph.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), str(Path(__file__).with_name(worker)),
                          str(tmp_path / "res"), backend], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]


@BACKENDS
def test_sync_batchnorm_two_processes_match_single_process_full_batch(tmp_path, backend):
    _launch_two("_syncbn_worker.py", tmp_path, backend)
    for rank in (0, 1):
        synced, local = (float(v) for v in (tmp_path / f"res.{rank}").read_text().split())
        assert synced <= 1e-5, f"rank {rank}: SyncBatchNorm vs single process: {synced}"
        assert local > 1e-3, f"rank {rank}: local BatchNorm should differ from the global batch, got {local}"


@BACKENDS
def test_two_processes_match_single_process(tmp_path, backend):
    _launch_two("_dp_worker.py", tmp_path, backend)
    for rank in (0, 1):
        worst, gathered = (tmp_path / f"res.{rank}").read_text().split(" ", 1)
        assert float(worst) <= 1e-6, f"rank {rank}: max |dp - single| = {worst}"
        assert gathered.strip() == "[0.0, 1.0]"


def test_jitted_data_parallel_step_trains_like_eager(tmp_path):
    """fg.jit with DataParallel on the store transport: the recorded all-reduces and buffer broadcasts run on
    every replay (host_call), so 12 jitted Adam steps equal 12 eager ones on both ranks."""
    _launch_two("_jit_dp_worker.py", tmp_path, "local")
    for rank in (0, 1):
        worst = float((tmp_path / f"res.{rank}").read_text())
        assert worst <= 1e-5, f"rank {rank}: max |jit - eager| = {worst}"


class _Loopback(Communicator):
    """A world of one that counts collectives (in-process checks of DataParallel's bookkeeping)."""

    rank, world_size = 0, 1

    def __init__(self):
        self.reduced = []

    def all_reduce(self, tensor, op="sum"):
        self.reduced.append(tensor.numel())
        return tensor

    def all_reduce_coalesced(self, tensors, op="sum", async_op=False):
        self.reduced.append(sum(t.numel() for t in tensors))  # one entry per bucket
        return tensors

    def broadcast(self, tensor, src=0):
        return tensor

    def all_gather(self, tensor):
        return [tensor.clone()]


def _model():
    fg.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    m[0].requires_grad_(False)
    return m


def test_buckets_reduced_once_frozen_never():
    m = _model()
    comm = _Loopback()
    dp = dist.DataParallel(m, bucket_cap_mb=100 / (1024 * 1024), communicator=comm)
    assert dp.module is m and list(m.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight",
                                                        "2.bias"]
    dp(fg.randn(3, 4)).sum().backward()
    # every trainable parameter is reduced exactly once; the frozen 8*4+8 elements never
    # buckets in order: (2.bias, 2.weight), then (1.bias, 1.weight): a layer's weight and bias stay together
    assert comm.reduced == [2 + 16, 8 + 64]
    assert m[0].weight.grad is None and m[2].weight.grad is not None


def test_buckets_are_rebuilt_in_the_order_the_first_backward_made_the_gradients():
    class Registered(nn.Module):  # registered c, b, a; used a -> b -> c, so backward makes c's gradients first
        def __init__(self):
            super().__init__()
            self.c = nn.Linear(5, 2)
            self.b = nn.Linear(4, 5)
            self.a = nn.Linear(3, 4)

        def forward(self, x):
            return self.c(self.b(self.a(x)))

    fg.manual_seed(0)
    m = Registered()
    comm = _Loopback()
    dp = dist.DataParallel(m, bucket_cap_mb=40 / (1024 * 1024), communicator=comm)  # a layer a bucket
    names = dp._names
    layers = lambda: [sorted({names[i].split(".")[0] for i in b}) for b in dp.buckets]  # noqa: E731
    assert layers() == [["a"], ["b"], ["c"]]  # reverse registration order: a guess, wrong here
    x = fg.randn(6, 3)
    dp(x).sum().backward()
    assert layers() == [["c"], ["b"], ["a"]]  # the order backward made them in
    grads = [p.grad.detach().numpy().copy() for p in m.parameters()]
    for p in m.parameters():
        p.grad = None
    comm.reduced.clear()
    dp(x).sum().backward()
    assert comm.reduced == [2 * 5 + 2, 5 * 4 + 5, 4 * 3 + 4]  # each parameter once, in the new buckets
    for p, g in zip(m.parameters(), grads):
        assert abs(p.grad.detach().numpy() - g).max() == 0.0


def test_gradients_accumulate_across_backwards():
    m = _model()
    dp = dist.DataParallel(m, communicator=_Loopback())
    x = fg.randn(3, 4)
    dp(x).sum().backward()
    g1 = m[2].weight.grad.detach().numpy().copy()
    dp(x).sum().backward()
    assert abs(m[2].weight.grad.detach().numpy() - 2 * g1).max() < 1e-5


def test_unused_parameter_needs_find_unused():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3)

        def forward(self, x):
            return self.a(x)

    dp = dist.DataParallel(Two(), communicator=_Loopback())
    dp(fg.randn(2, 3)).sum().backward()
    with pytest.raises(FlowError, match=r"no gradient for parameters \['b.weight', 'b.bias'\]"):
        dp.finish_gradients()
    with pytest.raises(FlowError, match="previous backward left gradients unreduced"):
        dp(fg.randn(2, 3))
    m = Two()
    dp = dist.DataParallel(m, communicator=_Loopback(), find_unused_parameters=True)
    dp(fg.randn(2, 3)).sum().backward()
    dp.finish_gradients()
    assert m.a.weight.grad is not None and float(abs(m.b.weight.grad.detach().numpy()).max()) == 0.0


def test_sync_batchnorm_conversion_shares_parameters_and_init_needs_env(monkeypatch):
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Sequential(nn.BatchNorm1d(4)))
    params = [id(p) for p in m.parameters()]
    buffers = [id(b) for b in m.buffers()]
    keys = list(m.state_dict())
    dp = dist.DataParallel(m, sync_batchnorm=True, communicator=_Loopback())
    assert isinstance(m[1], dist.SyncBatchNorm) and isinstance(m[2][0], dist.SyncBatchNorm)
    assert [id(p) for p in m.parameters()] == params and [id(b) for b in m.buffers()] == buffers
    assert list(m.state_dict()) == keys
    out = dp(fg.randn(6, 3))  # a world of one: plain batch norm
    assert out.shape == (6, 4)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(FlowError, match="environment variable RANK"):
        dist.init(backend="local")
    with pytest.raises(FlowError, match="not initialised"):
        dist.get_rank()
    with pytest.raises(FlowError, match="backend must be 'nccl' or 'local'"):
        dist.init(backend="gloo")


class _PlusOne(_Loopback):
    """Adds 1 in place per reduction: a tensor reduced twice shows +2."""

    def all_reduce_coalesced(self, tensors, op="sum", async_op=False):
        with fg.no_grad():
            for t in tensors:
                t.add_(1.0)
        return tensors


def test_gradient_array_shared_by_two_parameters_is_reduced_once_each():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(fg.zeros(3))
            self.b = nn.Parameter(fg.zeros(3))

        def forward(self, x):
            return x + self.a + self.b  # add's backward hands the same gradient to both inputs

    m = Two()
    dp = dist.DataParallel(m, communicator=_PlusOne())
    (dp(fg.ones(3)) * fg.tensor([1.0, 2.0, 3.0])).sum().backward()  # a contiguous upstream gradient
    assert m.a.grad.tolist() == [2.0, 3.0, 4.0] and m.b.grad.tolist() == [2.0, 3.0, 4.0]


@BACKENDS
def test_no_sync_accumulation_over_two_micro_batches_equals_one_big_batch(tmp_path, backend):
    _launch_two("_no_sync_worker.py", tmp_path, backend)
    for rank in (0, 1):
        no_sync, toggle, local = (tmp_path / f"res.{rank}").read_text().split()
        assert float(no_sync) <= 1e-6, f"rank {rank}: no_sync vs full batch: {no_sync}"
        assert float(toggle) <= 1e-6, f"rank {rank}: require_backward_grad_sync vs full batch: {toggle}"
        assert local == "1", f"rank {rank}: gradients were reduced inside no_sync"


class _Doubles(_Loopback):
    """Doubles in place per reduction (as if another rank held the same gradient and the op were a sum): shows
    which part of .grad was reduced."""

    def all_reduce_coalesced(self, tensors, op="sum", async_op=False):
        self.reduced.append(sum(t.numel() for t in tensors))
        with fg.no_grad():
            for t in tensors:
                t.mul_(2.0)
        return tensors


def test_no_sync_makes_no_collective_and_the_next_backward_reduces_the_accumulation_once():
    m = _model()
    comm = _Doubles()
    dp = dist.DataParallel(m, communicator=comm)
    x = fg.randn(3, 4)
    with dp.no_sync():
        assert dp.require_backward_grad_sync is False
        dp(x).sum().backward()
        dp(x).sum().backward()
    assert dp.require_backward_grad_sync is True and comm.reduced == []
    local = {n: p.grad.detach().numpy().copy() for n, p in m.named_parameters() if p.grad is not None}
    ref = _model()
    for _ in range(3):
        ref(x).sum().backward()
    dp(x).sum().backward()  # reduces the 2 local gradients and this one together: all three doubled
    assert len(comm.reduced) == len(dp.buckets)
    for name, p in m.named_parameters():
        if name in local:
            expected = 2 * dict(ref.named_parameters())[name].grad.detach().numpy()
            assert np.abs(p.grad.detach().numpy() - expected).max() < 1e-5, name
    dp(x).sum().backward()  # back to normal: the reduced .grad is shared by all ranks, only the new part is reduced
    for name, p in m.named_parameters():
        if name in local:
            expected = 8 * dict(ref.named_parameters())[name].grad.detach().numpy() / 3
            assert np.abs(p.grad.detach().numpy() - expected).max() < 1e-5, name


def test_require_backward_grad_sync_is_read_at_forward_as_in_torch():
    m = _model()
    comm = _Loopback()
    dp = dist.DataParallel(m, communicator=comm)
    dp.require_backward_grad_sync = False
    out = dp(fg.randn(3, 4))
    dp.require_backward_grad_sync = True  # too late for this pass, as with torch's DDP
    out.sum().backward()
    assert comm.reduced == []
    dp(fg.randn(3, 4)).sum().backward()
    assert len(comm.reduced) == len(dp.buckets)
