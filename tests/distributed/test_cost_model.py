"""The alpha-beta cost model of ``benchmarks/cost_model.py`` on cases whose answer is known (no timing)."""

import math

import pytest

from benchmarks import cost_model as cm

LINK = cm.Link("test", bandwidth=100.0, alpha=1.0)  # 100 bytes/s, 1 s per step: easy arithmetic


def test_one_rank_communicates_nothing():
    for fn in (cm.ring_all_reduce, cm.tree_all_reduce, cm.all_gather, cm.reduce_scatter):
        assert fn(1e9, 1, cm.NVLINK) == 0.0
    assert cm.hierarchical_all_reduce(1e9, 1, 1) == 0.0
    assert cm.ring_tree_crossover(1, LINK) == 0.0


def test_formulas_on_known_values():
    # ring: 2 (p-1)/p n/B + 2 (p-1) alpha = 2 * 3/4 * 400/100 + 6 = 12
    assert cm.ring_all_reduce(400, 4, LINK) == pytest.approx(12.0)
    # tree: 2 log2 p (alpha + n/B) = 4 * (1 + 4) = 20
    assert cm.tree_all_reduce(400, 4, LINK) == pytest.approx(20.0)
    # all-gather / reduce-scatter: (p-1)/p n/B + (p-1) alpha = 3 + 3
    assert cm.all_gather(400, 4, LINK) == cm.reduce_scatter(400, 4, LINK) == pytest.approx(6.0)
    # a ring all-reduce is a reduce-scatter followed by an all-gather
    assert cm.ring_all_reduce(400, 4, LINK) == pytest.approx(2 * cm.all_gather(400, 4, LINK))
    # large messages: the ring's bandwidth term tends to 2 n/B, independent of p
    assert cm.ring_all_reduce(1e12, 64, cm.NVLINK) == pytest.approx(2 * 1e12 / cm.NVLINK.bandwidth, rel=0.02)


def test_ring_tree_crossover():
    p = 8
    n = cm.ring_tree_crossover(p, LINK)
    # n = B alpha (p-1-log2 p) / (log2 p - (p-1)/p) = 100 * 4 / 2.125
    assert n == pytest.approx(100 * 4 / 2.125)
    assert cm.ring_all_reduce(n, p, LINK) == pytest.approx(cm.tree_all_reduce(n, p, LINK))
    assert cm.best_all_reduce(n / 2, p, LINK)[0] == "tree"
    assert cm.best_all_reduce(n * 2, p, LINK)[0] == "ring"
    # two ranks: the tree is never faster (equal only at 0 bytes)
    assert cm.ring_tree_crossover(2, LINK) == 0.0
    assert cm.best_all_reduce(1.0, 2, LINK)[0] == "ring"


def test_hierarchical_is_intra_reduce_scatter_inter_ring_intra_all_gather():
    intra, inter = cm.Link("in", 1000.0, 0.5), cm.Link("out", 10.0, 2.0)
    n, g, nodes = 800.0, 4, 2
    expected = 2 * cm.all_gather(n, g, intra) + cm.ring_all_reduce(n / g, nodes, inter)
    assert cm.hierarchical_all_reduce(n, g, nodes, intra, inter) == pytest.approx(expected)
    # one NIC shared by the node's 4 shard rings: each gets a quarter of its bandwidth
    shared = 2 * cm.all_gather(n, g, intra) + cm.ring_all_reduce(n / g, nodes, cm.Link("q", 2.5, 2.0))
    assert cm.hierarchical_all_reduce(n, g, nodes, intra, inter, nics_per_node=1) == pytest.approx(shared)
    # one node: only NVLink, as a ring all-reduce
    assert cm.hierarchical_all_reduce(n, g, 1, intra, inter) == pytest.approx(cm.ring_all_reduce(n, g, intra))


def test_calibration_reproduces_the_measured_two_gpu_step_and_overlap_helps():
    w = cm.calibrate("m", grad_bytes=67e6, samples_1=1000.0, samples_2=1600.0, batch_per_gpu=100)
    comm = cm.ring_all_reduce(67e6, 2, cm.NVLINK)
    last = cm.ring_all_reduce(w.last_bucket_bytes, 2, cm.NVLINK)
    for overlap in (False, True):
        assert w.step(comm, last, overlap) == pytest.approx(2 * 100 / 1600.0)  # the measured 2-GPU step
    assert w.efficiency(comm, last, False) == pytest.approx(0.8)
    big = 10 * w.compute_s
    assert w.step(big, last, True) < w.step(big, last, False)
    assert w.exposed(big, last, True) == pytest.approx(big - 2 / 3 * w.compute_s)
    assert w.exposed(0.0, last, True) == last  # the last bucket is never hidden


def test_transformer_compute_and_benchmark_parameter_counts():
    t = cm.transformer(n_params=1e9, tokens_per_gpu=1000, mfu=0.5, peak_flops=1e15)
    assert t.compute_s == pytest.approx(6 * 1e9 * 1000 / 5e14) and t.grad_bytes == 2e9
    from benchmarks.models import build_flowgraph, spec

    sp = spec("mlp")
    assert cm.mlp_parameters() == sp.width * sp.hidden + sp.hidden + 3 * (sp.hidden ** 2 + sp.hidden) + (
        sp.hidden * sp.out + sp.out) + 8 * sp.hidden
    small = sum(p.numel() for p in build_flowgraph("residual_tower", 1 / 64).parameters())
    d = spec("residual_tower", 1 / 64).hidden
    assert small == 14 * (d * d + d) + 12 * 2 * d  # the formula of residual_tower_parameters at a small size
    rows = cm.predictions()
    assert {r["layout"] for r in rows} >= {"8 GPUs, NVLink", "4x8, 8 x 400 Gb/s per node"}
    # overlap never predicts a slower step (equal at 2 GPUs, where both are calibrated to the measured one)
    assert all(0 < r["eff"] <= r["eff_overlap"] + 1e-12 <= 1 + 2e-12 and math.isfinite(r["step_s"]) for r in rows)
    with pytest.raises(ValueError, match="integer >= 1"):
        cm.ring_all_reduce(1.0, 0, LINK)
