"""Where a data-parallel step spends its time on the GPUs: the kernels and NCCL calls of every rank on one axis.

Run under the launcher, one process per GPU; each rank records a few training steps with CUPTI (through
``torch.profiler``, which sees every kernel in the process: CuPy's, cuBLAS's and NCCL's as well as torch's);
rank 0 gathers the ranks' kernels into ``--out``/``timeline.json`` and prints, per rank, how the profiled steps
split into compute, communication hidden under compute, exposed communication and idle time::

    python -m flowgraph.distributed.run --nproc-per-node 2 -m benchmarks.dp_timeline --model mlp --jit --out out
    python -m benchmarks.dp_timeline --render out/timeline.json --svg timeline.svg

``--render`` (no GPU needed) draws the recorded kernels of the ranks as an SVG: one lane for compute and one for
NCCL per rank, the last profiled step, every rank's clock taken from the same host.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import tempfile

import numpy as np


def _is_comm(name: str) -> bool:
    """Whether a kernel name is NCCL's (``ncclDevKernel_...``, ``ncclKernel_...``)."""
    return name.startswith("nccl")


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The sorted, merged union of ``(start, end)`` intervals."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the overlap of two unions (each sorted and disjoint)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(kernels: list[dict], steps: list[tuple[float, float]]) -> dict:
    """Per step (``steps``: the host-side ``(start, end)`` of each profiled step, us): the GPU span from the
    step's first kernel to its last, compute time, NCCL time, NCCL time overlapped by compute, exposed NCCL
    time and idle time, medians over the steps (us)."""
    rows = []
    for k, (s0, _) in enumerate(steps):
        nxt = steps[k + 1][0] if k + 1 < len(steps) else float("inf")
        mine = [x for x in kernels if s0 <= x["ts"] < nxt]
        if not mine:
            continue
        start = min(x["ts"] for x in mine)
        end = max(x["ts"] + x["dur"] for x in mine)
        comp = _union([(x["ts"], x["ts"] + x["dur"]) for x in mine if not _is_comm(x["name"])])
        comm = _union([(x["ts"], x["ts"] + x["dur"]) for x in mine if _is_comm(x["name"])])
        hidden = _intersection(comp, comm)
        busy = _length(_union(comp + comm))
        rows.append({"span": end - start, "compute": _length(comp), "nccl": _length(comm), "nccl_hidden": hidden,
                     "nccl_exposed": _length(comm) - hidden, "idle": (end - start) - busy,
                     "kernels": len(mine), "nccl_kernels": sum(_is_comm(x["name"]) for x in mine)})
    if not rows:
        return {}
    return {key: float(np.median([r[key] for r in rows])) for key in rows[0]}


def _kernels_of(trace: dict) -> tuple[list[dict], list[tuple[float, float]]]:
    """GPU kernels (name, ts, dur, stream) and the host ranges named ``fg_step`` of a Chrome trace."""
    kernels, steps = [], []
    for ev in trace.get("traceEvents", []):
        cat = ev.get("cat", "")
        if cat == "kernel":
            kernels.append({"name": ev["name"], "ts": float(ev["ts"]), "dur": float(ev.get("dur", 0)),
                            "stream": ev.get("args", {}).get("stream", ev.get("tid"))})
        elif cat == "user_annotation" and ev.get("name") == "fg_step":
            steps.append((float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0))))
    return sorted(kernels, key=lambda x: x["ts"]), sorted(steps)


def record(args) -> None:
    """Train a few steps data-parallel, profile ``--steps`` of them, write this rank's kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import flowgraph as fg
    import flowgraph.distributed as dist

    from .data_parallel import training_step

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init(backend="nccl")
    rank = dist.get_rank() if world > 1 else 0
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    torch.cuda.set_device(int(device.split(":")[1]))
    sp, dp, step, backend, rng = training_step(args, rank, world, device, args.jit)
    x = fg.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32), device=device)
    y = fg.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32), device=device)
    for _ in range(args.warmup):
        step(x, y).item()
    if world > 1:
        dist.barrier()
    backend.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            with record_function("fg_step"):
                loss = step(x, y)
                backend.synchronize()
            loss.item()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    kernels, steps = _kernels_of(trace)
    os.makedirs(args.out, exist_ok=True)
    what = {"model": args.model, "jit": args.jit, "rank": rank, "world": world, "batch_per_rank": sp.batch,
            "buckets": [len(b) for b in getattr(dp, "buckets", [])], "kernels": kernels, "steps": steps,
            "summary": summarize(kernels, steps)}
    with open(os.path.join(args.out, f"timeline_rank{rank}.json"), "w") as f:
        json.dump(what, f)
    if world > 1:
        dist.barrier()
    if rank == 0:  # every rank's file is written: the barrier above
        ranks = []
        for r in range(world):
            path = os.path.join(args.out, f"timeline_rank{r}.json")
            with open(path) as f:
                ranks.append(json.load(f))
            os.remove(path)
            print(f"rank {r} {args.model}{' jit' if args.jit else ''} (median of {args.steps} steps, us): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in ranks[-1]["summary"].items()), flush=True)
        with open(os.path.join(args.out, "timeline.json"), "w") as f:
            json.dump({"ranks": ranks}, f)
    if world > 1:
        dist.destroy()


def render(paths: list[str], svg: str, width: int = 1100) -> None:
    """Draw the last profiled step of each rank's recorded kernels (``record``'s files) as an SVG."""
    ranks = []
    for p in paths:
        with open(p) as f:
            found = json.load(f)
        ranks += found["ranks"] if "ranks" in found else [found]
    windows = []
    for r in ranks:
        s0 = r["steps"][-1][0]
        mine = [k for k in r["kernels"] if k["ts"] >= s0]
        windows.append((min(k["ts"] for k in mine), max(k["ts"] + k["dur"] for k in mine), mine))
    t0 = min(w[0] for w in windows)
    t1 = max(w[1] for w in windows)
    left, lane, gap = 120, 26, 10
    scale = (width - left - 20) / max(t1 - t0, 1.0)
    height = 40 + len(ranks) * (2 * lane + gap) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="12">',
           f'<text x="10" y="20">{ranks[0]["model"]}{" (fg.jit)" if ranks[0]["jit"] else " (eager)"}: one step on '
           f'{len(ranks)} GPUs, {t1 - t0:.0f} us; compute kernels blue, NCCL orange</text>']
    y = 40
    for r, (_, _, mine) in zip(ranks, windows):
        for j, label in enumerate(("compute", "NCCL")):
            out.append(f'<text x="10" y="{y + j * lane + 17}">rank {r["rank"]} {label}</text>')
            out.append(f'<rect x="{left}" y="{y + j * lane}" width="{width - left - 20}" height="{lane - 4}" '
                       'fill="#f4f4f4"/>')
        for k in mine:
            comm = _is_comm(k["name"])
            x = left + (k["ts"] - t0) * scale
            w = max(k["dur"] * scale, 0.5)
            yy = y + (lane if comm else 0)
            name = html.escape(k["name"][:80])
            out.append(f'<rect x="{x:.1f}" y="{yy}" width="{w:.1f}" height="{lane - 4}" '
                       f'fill="{"#e8831f" if comm else "#2f6db5"}"><title>{name} {k["dur"]:.1f} us</title></rect>')
        y += 2 * lane + gap
    for i in range(6):
        x = left + i * (width - left - 20) / 5
        out.append(f'<text x="{x:.0f}" y="{y + 15}">{(t1 - t0) * i / 5:.0f} us</text>')
    out.append("</svg>")
    with open(svg, "w") as f:
        f.write("\n".join(out) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--jit", action="store_true", help="profile fg.jit replays (one CUDA graph per rank)")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="out", help="folder for timeline.json")
    parser.add_argument("--render", nargs="+", default=None, help="draw these recorded files (timeline.json) instead")
    parser.add_argument("--svg", default="timeline.svg", help="--render: the SVG to write")
    args = parser.parse_args()
    if args.render:
        render(args.render, args.svg)
    else:
        record(args)


if __name__ == "__main__":
    main()
