"""Run by the launcher in test_zero.py: ``ZeroRedundancyOptimizer`` (Adam sharded over 2 ranks) vs plain Adam.

``python _zero_worker.py OUT [local|nccl]``; writes ``OUT.<rank>`` as JSON: the worst parameter difference after 10
steps (ZeRO vs DataParallel + Adam, both under a StepLR), the global indices whose state this rank holds, the
worst difference of the consolidated state dict against the unsharded one (rank 0), and the worst parameter
difference after resuming from a sharded checkpoint and from a consolidated one; with the store transport also
the worst difference of the same training with the step under ``fg.jit``.
"""

import json
import sys

import numpy as np

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import nn, optim

STEPS = 10


def make_model(device: str) -> nn.Module:
    fg.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    return model.to(device)


def make_opt(model: nn.Module, zero: bool):
    groups = [{"params": list(model[0].parameters()) + list(model[2].parameters())},
              {"params": list(model[4].parameters()), "lr": 0.02}]
    if zero:
        opt = dist.ZeroRedundancyOptimizer(groups, optimizer_class=optim.Adam, lr=0.05, betas=(0.8, 0.99))
    else:
        opt = optim.Adam(groups, lr=0.05, betas=(0.8, 0.99))
    return opt, optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3)


def train(dp, opt, sched, data, steps) -> None:
    for x, y in data[steps]:
        loss = ((dp(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def worst(a: nn.Module, b: nn.Module) -> float:
    return max(float(np.abs(p.detach().numpy() - q.detach().numpy()).max())
               for p, q in zip(a.parameters(), b.parameters()))


def state_diff(mine: dict, ref: dict) -> float:
    """Largest difference between two optimizer state dicts; inf where their structure differs."""
    if sorted(mine["state"]) != sorted(ref["state"]):
        return float("inf")
    if mine["param_groups"] != ref["param_groups"]:
        return float("inf")
    out = 0.0
    for idx, buffers in ref["state"].items():
        if sorted(buffers) != sorted(mine["state"][idx]):
            return float("inf")
        for key, value in buffers.items():
            other = mine["state"][idx][key]
            if isinstance(value, fg.Tensor):
                out = max(out, float(np.abs(value.numpy() - other.numpy()).max()))
            elif value != other:
                return float("inf")
    return out


def main(out_path: str, backend: str = "local") -> None:
    dist.init(backend=backend, timeout=60)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    rng = np.random.default_rng(3)
    shard = dist.shard(8, rank, world, shuffle=False)
    batches = [(fg.tensor(rng.standard_normal((8, 6)).astype(np.float32)[shard], device=device),
                fg.tensor(rng.standard_normal((8, 3)).astype(np.float32)[shard], device=device))
               for _ in range(STEPS)]
    data = {STEPS: batches, "first": batches[:STEPS // 2], "rest": batches[STEPS // 2:]}
    result = {}

    # the reference: DataParallel + Adam, every rank holding the whole state
    ref = make_model(device)
    ref_dp = dist.DataParallel(ref)
    ref_opt, ref_sched = make_opt(ref, zero=False)
    train(ref_dp, ref_opt, ref_sched, data, STEPS)

    model = make_model(device)
    dp = dist.DataParallel(model)
    opt, sched = make_opt(model, zero=True)
    train(dp, opt, sched, data, STEPS)
    result["diff"] = worst(model, ref)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    result["owned"] = sorted(index[id(p)] for p in opt.optim.state)
    result["state_keys"] = sorted(int(k) for k in opt.sharded_state_dict()["state"])
    result["lr"] = [g["lr"] for g in opt.param_groups] + [g["lr"] for g in opt.optim.param_groups]
    if backend == "local":
        # fg.jit: the wrapper's step (inner Adam, then the owners' broadcasts) replays as one host unit, so the
        # scheduler's lr and the collectives run again on every replay
        jit_model = make_model(device)
        jit_dp = dist.DataParallel(jit_model)
        jit_opt, jit_sched = make_opt(jit_model, zero=True)

        def step(x, y):
            loss = ((jit_dp(x) - y) ** 2).mean()
            loss.backward()
            jit_opt.step()
            jit_opt.zero_grad()
            return loss

        run = fg.jit(step)
        for x, y in batches:
            run(x, y)
            jit_sched.step()
        result["jit"], result["recordings"] = worst(jit_model, model), run.recordings
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        result["consolidated_state"] = state_diff(opt.state_dict(), ref_opt.state_dict())
    else:
        try:
            opt.state_dict()
            result["refused"] = False
        except fg.FlowError:
            result["refused"] = True

    # resume half-way: from each rank's shard file, and from a consolidated state dict saved by rank 0
    path = out_path + ".optim.fg"
    first = make_model(device)
    first_dp = dist.DataParallel(first)
    first_opt, first_sched = make_opt(first, zero=True)
    train(first_dp, first_opt, first_sched, data, "first")
    result["shard_file"] = first_opt.save_sharded_state_dict(path)
    first_opt.consolidate_state_dict(to=0)
    if rank == 0:
        fg.save({"model": first.state_dict(), "optim": first_opt.state_dict(), "sched": first_sched.state_dict()},
                out_path + ".full.fg")
    dist.barrier()
    saved = fg.load(out_path + ".full.fg", map_location=device)
    for way in ("sharded", "consolidated"):
        resumed = make_model(device)
        with fg.no_grad():
            for p in resumed.parameters():
                p.mul_(0.0)  # nothing of the fresh start may survive the load
        resumed.load_state_dict(saved["model"])
        resumed_dp = dist.DataParallel(resumed)
        resumed_opt, resumed_sched = make_opt(resumed, zero=True)
        resumed_sched.load_state_dict(saved["sched"])
        if way == "sharded":
            resumed_opt.load_sharded_state_dict(path)
        else:
            resumed_opt.load_state_dict(saved["optim"])
        train(resumed_dp, resumed_opt, resumed_sched, data, "rest")
        result[way] = worst(resumed, ref)
    with open(out_path + f".{rank}", "w") as f:
        json.dump(result, f)
    dist.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:])
