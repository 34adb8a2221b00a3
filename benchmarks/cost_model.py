"""An alpha-beta cost model of data-parallel training beyond 2 GPUs: predictions, not measurements.

    python benchmarks/cost_model.py          # prints the assumptions and a Markdown table

A collective's time is ``latency steps * alpha + bytes on the busiest link / bandwidth`` (Hockney's model, the
one NCCL's own tuner and ``nccl-tests``' "bus bandwidth" use). The formulas (``n`` bytes per rank, ``p`` ranks,
``B`` the bus bandwidth per direction, ``alpha`` the latency of one step):

* ring all-reduce: ``2 (p-1)/p * n/B + 2 (p-1) alpha`` (a reduce-scatter then an all-gather, ``p-1`` steps each);
* tree all-reduce: ``2 log2(p) * (alpha + n/B)`` (reduce up a binary tree, broadcast down; not pipelined);
* all-gather and reduce-scatter (``n`` = the whole gathered tensor): ``(p-1)/p * n/B + (p-1) alpha``;
* hierarchical all-reduce over ``nodes x g`` GPUs: reduce-scatter inside each node (NVLink), an all-reduce of each
  GPU's ``n/g`` shard across the nodes (one ring per GPU position, each over that GPU's NIC, or all sharing the
  node's NICs), and an all-gather inside the node.

A step is ``compute + exposed communication + residual``: ``compute`` the measured 1-GPU step (or ``6 N tokens``
FLOPs at an assumed MFU); without overlap the whole collective is exposed; with overlap the collective runs during
the backward (2/3 of the compute) and only what exceeds it, and at least the last bucket's reduction, is exposed.
``residual`` is what the measured 2-GPU step loses beyond the model's communication (rank skew, host time,
launch and synchronisation): calibrated at p = 2 and assumed not to grow with p (optimistic). Scaling efficiency
is the 1-GPU step over the p-GPU step at a fixed per-GPU batch (weak scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """A transport: ``bandwidth`` in bytes/s per direction (bus bandwidth) and ``alpha`` seconds per step."""

    name: str
    bandwidth: float
    alpha: float


#: H100/H200 NVLink 4 (18 links, 900 GB/s per GPU both directions together, 450 GB/s per direction on the data
#: sheet), as measured: NCCL 2.28's all-reduces of DataParallel's buckets on 2 H200s (NV18), inside a replayed
#: step with nothing running beside them, took 107-116 us for the 25.2 MB last bucket and 53-62 us for an 8.4 MB
#: one (CUPTI, ``benchmarks/dp_timeline.py``; docs/results/dp_2xh200_r31.txt). A 2-rank ring moves ``n/B`` and
#: takes 2 steps: fitted, ``B`` = 305 GB/s and ``alpha`` = 14 us, below the data sheet at these message sizes.
NVLINK = Link("NVLink (H200, measured)", 305e9, 14e-6)
#: One 400 Gb/s InfiniBand NDR / RoCE port: 50 GB/s per direction; ~15 us per step across the network.
IB_400G = Link("400 Gb/s", 50e9, 15e-6)


def _check(n_bytes: float, p: int) -> None:
    if p < 1 or int(p) != p:
        raise ValueError(f"the number of ranks p must be an integer >= 1, got {p!r}")
    if n_bytes < 0:
        raise ValueError(f"the message size must be >= 0 bytes, got {n_bytes!r}")


def ring_all_reduce(n_bytes: float, p: int, link: Link) -> float:
    """Seconds for a ring all-reduce of ``n_bytes`` per rank over ``p`` ranks: ``2(p-1)/p n/B + 2(p-1) alpha``."""
    _check(n_bytes, p)
    return 2 * (p - 1) / p * n_bytes / link.bandwidth + 2 * (p - 1) * link.alpha


def tree_all_reduce(n_bytes: float, p: int, link: Link) -> float:
    """Seconds for a (binary, unpipelined) tree all-reduce: ``2 log2(p) (alpha + n/B)``."""
    _check(n_bytes, p)
    return 2 * math.log2(p) * (link.alpha + n_bytes / link.bandwidth)


def all_gather(n_bytes: float, p: int, link: Link) -> float:
    """Seconds for a ring all-gather whose result is ``n_bytes`` (each rank contributes ``n/p``):
    ``(p-1)/p n/B + (p-1) alpha``. A reduce-scatter of ``n_bytes`` costs the same."""
    _check(n_bytes, p)
    return (p - 1) / p * n_bytes / link.bandwidth + (p - 1) * link.alpha


reduce_scatter = all_gather


def ring_tree_crossover(p: int, link: Link) -> float:
    """The message size (bytes) below which the tree all-reduce is faster than the ring at ``p`` ranks (0 when
    the ring is never slower, as at p <= 2). Solves ``ring_all_reduce == tree_all_reduce`` for ``n``."""
    _check(0, p)
    slope = math.log2(p) - (p - 1) / p  # per n/B: tree's 2 log2 p minus ring's 2 (p-1)/p, halved
    if slope <= 0:
        return 0.0
    return max(0.0, link.bandwidth * link.alpha * (p - 1 - math.log2(p)) / slope)


def best_all_reduce(n_bytes: float, p: int, link: Link) -> tuple[str, float]:
    """``("ring" | "tree", seconds)``: the faster of the two (what a tuner such as NCCL's would pick)."""
    ring, tree = ring_all_reduce(n_bytes, p, link), tree_all_reduce(n_bytes, p, link)
    return ("tree", tree) if tree < ring else ("ring", ring)


def hierarchical_all_reduce(n_bytes: float, gpus_per_node: int, nodes: int, intra: Link = NVLINK,
                            inter: Link = IB_400G, nics_per_node: int | None = None) -> float:
    """Seconds for an all-reduce over ``nodes x gpus_per_node`` GPUs: intra-node ring reduce-scatter, inter-node
    ring all-reduce of each GPU's ``n/g`` shard, intra-node ring all-gather.

    ``nics_per_node`` (default: one per GPU, as a DGX H100's eight 400 Gb/s ports): the ``g`` shard rings share
    them, so each ring gets ``nics / g`` of a port's bandwidth.
    """
    g = gpus_per_node
    _check(n_bytes, g)
    _check(n_bytes, nodes)
    nics = g if nics_per_node is None else nics_per_node
    if nics < 1:
        raise ValueError(f"nics_per_node must be >= 1, got {nics}")
    share = min(1.0, nics / g)
    across = Link(inter.name, inter.bandwidth * share, inter.alpha)
    return (reduce_scatter(n_bytes, g, intra) + ring_all_reduce(n_bytes / g, nodes, across)
            + all_gather(n_bytes, g, intra))


@dataclass(frozen=True)
class Workload:
    """One model's data-parallel step: gradient bytes, the 1-GPU step time and the calibrated residual."""

    name: str
    grad_bytes: float
    compute_s: float
    residual_s: float = 0.0
    residual_overlap_s: float = 0.0  # the same, calibrated under the overlap assumption
    last_bucket_bytes: float = 25 * 2**20  # DataParallel's default bucket cap: the reduction nothing overlaps

    def exposed(self, comm_s: float, last_bucket_s: float, overlap: bool) -> float:
        """The communication the step waits for: all of it, or what the backward (2/3 of the compute: 6N FLOPs
        per token, 2N forward and 4N backward) does not hide, and at least the last bucket's reduction."""
        if not overlap:
            return comm_s
        return max(comm_s - 2 / 3 * self.compute_s, last_bucket_s, 0.0)

    def step(self, comm_s: float, last_bucket_s: float, overlap: bool) -> float:
        """The step time with ``comm_s`` of communication: all exposed, or overlapped with the backward."""
        residual = self.residual_overlap_s if overlap else self.residual_s
        return self.compute_s + self.exposed(comm_s, last_bucket_s, overlap) + residual

    def efficiency(self, comm_s: float, last_bucket_s: float, overlap: bool) -> float:
        """1-GPU step / p-GPU step (weak scaling: the same batch per GPU)."""
        return self.compute_s / self.step(comm_s, last_bucket_s, overlap)


def calibrate(name: str, grad_bytes: float, samples_1: float, samples_2: float, batch_per_gpu: int,
              link: Link = NVLINK) -> Workload:
    """A workload from the measured 1-GPU and 2-GPU throughputs (samples/s at ``batch_per_gpu`` per GPU): the
    1-GPU step is the compute; what the 2-GPU step adds beyond the modelled ring all-reduce's exposed part is the
    residual (0 when the model explains it all), once assuming no overlap and once assuming overlap, so that both
    columns reproduce the measured 2-GPU step."""
    t1 = batch_per_gpu / samples_1
    t2 = 2 * batch_per_gpu / samples_2
    bare = Workload(name, grad_bytes, t1, last_bucket_bytes=min(grad_bytes, 25 * 2**20))
    comm, last = ring_all_reduce(grad_bytes, 2, link), ring_all_reduce(bare.last_bucket_bytes, 2, link)
    return Workload(name, grad_bytes, t1, max(0.0, t2 - t1 - bare.exposed(comm, last, False)),
                    max(0.0, t2 - t1 - bare.exposed(comm, last, True)), bare.last_bucket_bytes)


def transformer(n_params: float = 1e9, tokens_per_gpu: int = 16 * 1024, mfu: float = 0.40,
                peak_flops: float = 989e12, grad_bytes_per_param: int = 2) -> Workload:
    """A dense transformer: compute ``6 N tokens / (MFU * peak)`` (H100 SXM bf16 dense peak 989 TFLOP/s), bf16
    gradients; no residual (nothing measured)."""
    return Workload(f"transformer {n_params / 1e9:g}B", n_params * grad_bytes_per_param,
                    6 * n_params * tokens_per_gpu / (mfu * peak_flops), 0.0)


def mlp_parameters() -> int:
    """The mlp benchmark model's parameter count at full size (``benchmarks/models.py``): five Linear layers
    and four LayerNorms."""
    from .models import spec

    sp = spec("mlp")
    linear = [(sp.width, sp.hidden)] + [(sp.hidden, sp.hidden)] * 3 + [(sp.hidden, sp.out)]
    return sum(i * o + o for i, o in linear) + 4 * 2 * sp.hidden


#: Measured on 2 x H200 with NVLink (docs/results/dp_2xh200_r31.txt): samples/s at batch 256 per GPU, 1 GPU and 2
#: GPUs. fg.jit from the session's last call (the final bucketing); eager from its first call (these hosts' eager
#: steps vary from call to call: the ranks' Python sets the pace).
MEASURED = {
    "mlp eager": (129_426, 124_615),
    "mlp jit": (254_824, 398_659),
    "residual_tower eager": (47_948, 75_128),
    "residual_tower jit": (188_227, 321_051),
}


def residual_tower_parameters() -> int:
    """The residual_tower benchmark model's parameter count at full size: 14 Linear layers, 12 LayerNorms."""
    from .models import spec

    sp = spec("residual_tower")
    return (sp.width * sp.hidden + sp.hidden) + 12 * (sp.hidden * sp.hidden + sp.hidden + 2 * sp.hidden) + (
        sp.hidden * sp.out + sp.out)


def workloads() -> list[Workload]:
    """The calibrated benchmark models and the 1B transformer."""
    sizes = {"mlp": 4 * mlp_parameters(), "residual_tower": 4 * residual_tower_parameters()}
    out = [calibrate(name, sizes[name.split()[0]], s1, s2, 256) for name, (s1, s2) in MEASURED.items()]
    return [*out, transformer()]


def predictions() -> list[dict]:
    """One row per workload and topology: communication seconds, step seconds and efficiency with and without
    overlap."""
    rows = []
    for w in workloads():
        layouts = [
            ("2 GPUs, NVLink", *best_all_reduce(w.grad_bytes, 2, NVLINK),
             ring_all_reduce(w.last_bucket_bytes, 2, NVLINK)),
            ("8 GPUs, NVLink", *best_all_reduce(w.grad_bytes, 8, NVLINK),
             best_all_reduce(w.last_bucket_bytes, 8, NVLINK)[1]),
            ("4x8, 8 x 400 Gb/s per node", "hier. ring", hierarchical_all_reduce(w.grad_bytes, 8, 4),
             hierarchical_all_reduce(w.last_bucket_bytes, 8, 4)),
            ("4x8, 1 x 400 Gb/s per node", "hier. ring", hierarchical_all_reduce(w.grad_bytes, 8, 4, nics_per_node=1),
             hierarchical_all_reduce(w.last_bucket_bytes, 8, 4, nics_per_node=1)),
        ]
        for layout, algo, comm, last in layouts:
            rows.append({"workload": w.name, "layout": layout, "algorithm": algo, "comm_s": comm,
                         "compute_s": w.compute_s, "residual_s": w.residual_s,
                         "residual_overlap_s": w.residual_overlap_s,
                         "step_s": w.step(comm, last, overlap=False), "step_overlap_s": w.step(comm, last, True),
                         "eff": w.efficiency(comm, last, False), "eff_overlap": w.efficiency(comm, last, True)})
    return rows


def main() -> None:
    print(f"links: {NVLINK}, {IB_400G}")
    print(f"mlp: {mlp_parameters():,} parameters; residual_tower: {residual_tower_parameters():,}; "
          "float32 gradients; transformer: 1e9 parameters, bf16 gradients, 16,384 tokens per GPU per step, "
          "40% MFU of 989 TFLOP/s")
    for p in (4, 8, 32):
        print(f"ring/tree crossover at p={p} over NVLink: {ring_tree_crossover(p, NVLINK) / 1e6:.2f} MB")
    print()
    print("| workload | layout | all-reduce | comm ms | 1-GPU step ms | residual ms (no overlap / overlap) | "
          "step ms (no overlap) | efficiency | step ms (overlap) | efficiency |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in predictions():
        print(f"| {r['workload']} | {r['layout']} | {r['algorithm']} | {1e3 * r['comm_s']:.3f} | "
              f"{1e3 * r['compute_s']:.3f} | {1e3 * r['residual_s']:.3f} / {1e3 * r['residual_overlap_s']:.3f} | "
              f"{1e3 * r['step_s']:.3f} | "
              f"{r['eff']:.1%} | {1e3 * r['step_overlap_s']:.3f} | {r['eff_overlap']:.1%} |")


if __name__ == "__main__":
    if __package__ in (None, ""):
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        __package__ = "benchmarks"  # noqa: A001  # run as a script: the relative import of .models needs it
    main()
