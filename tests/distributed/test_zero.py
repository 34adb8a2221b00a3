"""``ZeroRedundancyOptimizer``: optimizer state sharded across ranks (ZeRO stage 1)."""

import json

import numpy as np
import pytest

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import optim
from flowgraph.distributed.comm import Communicator
from flowgraph.errors import FlowError

from .test_data_parallel import BACKENDS, _launch_two


class _World(Communicator):
    """Rank ``rank`` of a world of ``world_size`` whose collectives do nothing (in-process bookkeeping checks)."""

    def __init__(self, rank=0, world_size=1):
        self.rank, self.world_size = rank, world_size
        self.broadcasts = []

    def all_reduce_coalesced(self, tensors, op="sum", async_op=False):
        return tensors

    def broadcast(self, tensor, src=0):
        self.broadcasts.append((tensor.numel(), src))
        return tensor

    def all_gather(self, tensor):
        return [tensor.clone() for _ in range(self.world_size)]


def _sizes(partition):
    return [sum(p.numel() for g in groups for p in g) for groups in partition]


def test_partition_is_torch_greedy_rule_largest_first_to_the_emptiest_rank():
    a, b, c, d, e = (fg.zeros(n) for n in (4, 10, 7, 3, 10))
    part = dist.partition_parameters([[a, b, c], [d, e]], 2)
    # group 0 sorted: b(10), c(7), a(4): b->0, c->1, a->1 (7 < 10); group 1: e(10)->1? sizes are [10, 11]: e->0
    assert [[[t.numel() for t in g] for g in groups] for groups in part] == [[[10], [10]], [[7, 4], [3]]]
    assert _sizes(part) == [20, 14]
    # ties go to the lowest rank, equal sizes keep their group order
    x, y, z = fg.zeros(5), fg.zeros(5), fg.zeros(5)
    part = dist.partition_parameters([[x, y, z]], 3)
    assert [groups[0][0] is t for groups, t in zip(part, (x, y, z))] == [True, True, True]
    with pytest.raises(FlowError, match="world_size must be an integer >= 1"):
        dist.partition_parameters([[x]], 0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.distributed.optim imports torch.jit.script
@pytest.mark.parametrize("world", [2, 3, 4])
def test_partition_equals_torch_zero_redundancy_optimizer(world):
    """torch's own partition (its ``_partition_parameters``, run without a process group on a stand-in ``self``)
    assigns the same parameters to the same ranks."""
    import types

    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    rng = np.random.default_rng(world)
    sizes = [[int(n) for n in rng.integers(1, 50, size=k)] for k in (6, 4)]
    tgroups = [{"params": [torch.zeros(n) for n in g]} for g in sizes]
    me = types.SimpleNamespace(world_size=world, param_groups=tgroups, _partition_parameters_cache=[])
    for name in ("_partition_parameters", "_get_min_index", "_partition_param_group"):
        setattr(me, name, getattr(TorchZero, name).__get__(me))
    where = {id(p): (gi, pi) for gi, g in enumerate(tgroups) for pi, p in enumerate(g["params"])}
    expected = [[[where[id(p)] for p in g["params"]] for g in groups] for groups in me._partition_parameters()]
    fgroups = [[fg.zeros(n) for n in g] for g in sizes]
    where = {id(p): (gi, pi) for gi, g in enumerate(fgroups) for pi, p in enumerate(g)}
    got = [[[where[id(p)] for p in g] for g in groups] for groups in dist.partition_parameters(fgroups, world)]
    assert got == expected


def test_sharded_checkpoint_path_names_rank_and_world():
    assert dist.sharded_checkpoint_path("ckpt/optim.fg", 1, 4) == "ckpt/optim.rank1-of-4.fg"
    assert dist.sharded_checkpoint_path("optim", 0, 2) == "optim.rank0-of-2"


def _params(device):
    rng = np.random.default_rng(0)
    return [fg.tensor(rng.standard_normal(s).astype(np.float32), device=device, requires_grad=True)
            for s in ((4, 3), (4,), (2, 4))]


def _loss(params, x):
    w1, b1, w2 = params
    return ((x @ w1.transpose(0, 1) + b1).tanh() @ w2.transpose(0, 1)).pow(2).mean()


def test_world_of_one_steps_like_torch_adam_with_scheduler(device):
    """One rank owns everything: the wrapper steps as torch.optim.Adam, and a scheduler's lr reaches the inner
    optimizer."""
    import torch

    params = _params(device)
    zero = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, communicator=_World(), lr=0.1,
                                        betas=(0.8, 0.95), weight_decay=0.01)
    sched = optim.lr_scheduler.StepLR(zero, step_size=2, gamma=0.5)
    tparams = [torch.tensor(p.detach().numpy(), requires_grad=True) for p in params]
    topt = torch.optim.Adam(tparams, lr=0.1, betas=(0.8, 0.95), weight_decay=0.01)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.5)
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    for _ in range(6):
        _loss(params, fg.tensor(x, device=device)).backward()
        zero.step()
        zero.zero_grad()
        sched.step()
        _loss(tparams, torch.tensor(x)).backward()
        topt.step()
        topt.zero_grad()
        tsched.step()
    assert zero.param_groups[0]["lr"] == topt.param_groups[0]["lr"] == 0.1 * 0.5 ** 3
    assert zero.optim.param_groups[0]["lr"] == 0.1 * 0.5 ** 2  # the lr of the last step; the next step syncs
    assert zero.param_groups[0]["betas"] == (0.8, 0.95)  # the inner optimizer's hyper-parameters show here
    for p, t in zip(params, tparams):
        np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)
        assert p.grad is None
    zero.consolidate_state_dict(to=0)
    state = zero.state_dict()["state"]
    tstate = topt.state_dict()["state"]
    assert sorted(state) == sorted(tstate) == [0, 1, 2]
    for i in state:
        assert state[i]["step"] == float(tstate[i]["step"])
        np.testing.assert_allclose(state[i]["exp_avg_sq"].numpy(), tstate[i]["exp_avg_sq"].numpy(), rtol=1e-5,
                                   atol=1e-7)


def test_rank_keeps_state_of_its_shard_only_and_broadcasts_from_owners():
    params = _params("cpu")  # numels 12, 4, 8: rank 0 gets the 12, rank 1 the 8 then the 4
    comm = _World(rank=1, world_size=2)
    zero = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, communicator=comm, lr=0.1)
    assert [zero.owner(p) for p in params] == [0, 1, 1]
    assert zero.optim.param_groups[0]["params"] == [params[2], params[1]]
    _loss(params, fg.ones(2, 3)).backward()
    zero.step()
    assert {id(p) for p in zero.state} == {id(params[1]), id(params[2])}
    assert set(zero.sharded_state_dict()["state"]) == {1, 2}
    # one broadcast of rank 0's single parameter, one of rank 1's two flattened
    assert comm.broadcasts == [(12, 0), (12, 1)]
    with pytest.raises(FlowError, match="not been consolidated on this rank"):
        zero.state_dict()
    other = dist.ZeroRedundancyOptimizer(_params("cpu"), optimizer_class=optim.Adam,
                                         communicator=_World(rank=0, world_size=2), lr=0.1)
    with pytest.raises(FlowError, match=r"saved by rank 1 of 2, this is rank 0 of 2"):
        other.load_sharded_state_dict(zero.sharded_state_dict())


def test_add_param_group_keeps_earlier_owners():
    params = _params("cpu")
    zero = dist.ZeroRedundancyOptimizer(params[:2], optimizer_class=optim.SGD,
                                        communicator=_World(rank=0, world_size=2), lr=0.1, momentum=0.9)
    before = [zero.owner(p) for p in params[:2]]
    zero.add_param_group({"params": [params[2]], "lr": 0.5})
    assert [zero.owner(p) for p in params[:2]] == before == [0, 1]
    assert zero.owner(params[2]) == 1  # rank 1 held 4 elements, rank 0 twelve
    assert len(zero.optim.param_groups) == 2 and zero.optim.param_groups[1]["params"] == []
    assert zero.param_groups[1]["momentum"] == 0.9 and zero.param_groups[1]["lr"] == 0.5


def test_bad_arguments_raise_flow_errors(tmp_path):
    params = _params("cpu")
    with pytest.raises(FlowError, match="optimizer_class must be a flowgraph optimizer class"):
        dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam(params), communicator=_World())
    with pytest.raises(FlowError, match=r"overlap_with_ddp=True\) is not supported"):
        dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, communicator=_World(), overlap_with_ddp=True)
    zero = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, communicator=_World(),
                                        parameters_as_bucket_view=False)
    assert zero.state is zero.optim.state
    with pytest.raises(FlowError, match=r"to must be a rank, 0..0"):
        zero.consolidate_state_dict(to=1)
    with pytest.raises(FlowError, match="no shard file .*rank0-of-1"):
        zero.load_sharded_state_dict(tmp_path / "missing.fg")
    with pytest.raises(FlowError, match="has 2 parameter groups, this optimizer has 1"):
        zero.load_state_dict({"state": {}, "param_groups": [{"params": []}, {"params": []}]})


def test_sharded_round_trip_in_one_process(tmp_path):
    params = _params("cpu")
    zero = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, communicator=_World(), lr=0.1)
    _loss(params, fg.ones(2, 3)).backward()
    zero.step()
    written = zero.save_sharded_state_dict(tmp_path / "optim.fg")
    assert written == str(tmp_path / "optim.rank0-of-1.fg")
    fresh = dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.Adam, communicator=_World(), lr=0.7)
    fresh.load_sharded_state_dict(tmp_path / "optim.fg")
    assert fresh.param_groups[0]["lr"] == 0.1 and fresh.optim.param_groups[0]["lr"] == 0.1
    for p in params:
        np.testing.assert_array_equal(fresh.state[p]["exp_avg"].numpy(), zero.state[p]["exp_avg"].numpy())
        assert fresh.state[p]["step"] == 1.0


@BACKENDS
def test_two_ranks_match_data_parallel_adam_and_checkpoints_resume(tmp_path, backend):
    _launch_two("_zero_worker.py", tmp_path, backend)
    results = [json.loads((tmp_path / f"res.{rank}").read_text()) for rank in (0, 1)]
    n_params = 6
    owned = [set(r["owned"]) for r in results]
    assert owned[0] and owned[1] and not owned[0] & owned[1] and owned[0] | owned[1] == set(range(n_params))
    for rank, r in enumerate(results):
        assert r["diff"] <= 1e-6, f"rank {rank}: ZeRO vs DataParallel + Adam after 10 steps: {r['diff']}"
        assert r["state_keys"] == r["owned"], f"rank {rank}: state beyond its shard"
        # the wrapper's lr after the last scheduler step, the inner optimizer's the lr of the last step
        expected = [0.05 * 0.3 ** 5, 0.02 * 0.3 ** 5, 0.05 * 0.3 ** 4, 0.02 * 0.3 ** 4]
        assert r["lr"] == pytest.approx(expected, rel=1e-12), f"rank {rank}: lr {r['lr']}"
        assert r["sharded"] <= 1e-6, f"rank {rank}: resumed from its shard file: {r['sharded']}"
        assert r["consolidated"] <= 1e-6, f"rank {rank}: resumed from the consolidated state: {r['consolidated']}"
        if backend == "local":
            assert r["jit"] <= 1e-6 and r["recordings"] == 1, f"rank {rank}: fg.jit vs eager: {r['jit']}"
        assert r["shard_file"].endswith(f"res.optim.rank{rank}-of-2.fg")
    assert results[0]["consolidated_state"] <= 1e-6
    assert results[1]["refused"] is True
