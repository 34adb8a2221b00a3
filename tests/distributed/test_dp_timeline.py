"""The data-parallel timeline's accounting and drawing (``benchmarks/dp_timeline.py``) on made-up kernels."""

import json
import xml.etree.ElementTree as ET

import pytest

from benchmarks import dp_timeline as tl


def _kernels(offset: float = 0.0) -> list[dict]:
    """One step: 50 compute kernels of 8 us every 10 us from 0, one NCCL all-reduce over [300, 700)."""
    ks = [{"name": "fg_ew", "ts": offset + 10 * i, "dur": 8.0, "stream": 7} for i in range(50)]
    ks.append({"name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": offset + 300, "dur": 400.0, "stream": 20})
    return ks


def test_summary_splits_the_step_into_compute_hidden_and_exposed_communication():
    s = tl.summarize(_kernels() + _kernels(1000), [(0, 900), (1000, 1900)])
    assert s["span"] == pytest.approx(700)  # first kernel at 0, the all-reduce ends at 700
    assert s["compute"] == pytest.approx(400)  # 50 x 8 us
    assert s["nccl"] == pytest.approx(400)
    assert s["nccl_hidden"] == pytest.approx(20 * 8)  # the 20 compute kernels inside [300, 500)
    assert s["nccl_exposed"] == pytest.approx(400 - 160)
    assert s["idle"] == pytest.approx(700 - (400 + 240))  # the gaps between compute kernels before 300
    assert s["kernels"] == 51 and s["nccl_kernels"] == 1
    assert tl.summarize([], [(0, 1)]) == {}


def test_render_draws_every_kernel_of_the_last_step_with_escaped_names(tmp_path):
    ranks = []
    for r in range(2):
        ks = _kernels(5 * r) + [{"name": "void k<float, 4>", "ts": 5 * r + 800, "dur": 3.0, "stream": 7}]
        ranks.append({"model": "mlp", "jit": True, "rank": r, "world": 2, "kernels": ks, "steps": [(0, 900)]})
    (tmp_path / "timeline.json").write_text(json.dumps({"ranks": ranks}))
    svg = tmp_path / "t.svg"
    tl.render([str(tmp_path / "timeline.json")], str(svg))
    root = ET.parse(svg).getroot()  # well-formed: the kernel name's < > are escaped
    titles = [e.text for e in root.iter("{http://www.w3.org/2000/svg}title")]
    assert len(titles) == 2 * 52 and "void k<float, 4> 3.0 us" in titles
