"""Only rank 0 writes checkpoints and reports and serves the dashboard; other ranks run the same script quietly."""

import io
import types

import pytest

import flowgraph as fg
import flowgraph.distributed as dist
from flowgraph import nn
from flowgraph.builder import FlowBuilder


@pytest.fixture
def rank(monkeypatch):
    def set_rank(r: int) -> None:
        monkeypatch.setattr(dist, "_state", types.SimpleNamespace(rank=r, world_size=2))

    return set_rank


def _graph():
    fg.manual_seed(0)
    return FlowBuilder.from_(nn.Linear(3, 2)).build()


def test_outside_a_process_group_everything_is_main():
    assert dist.is_main_process()


def test_checkpoints_written_by_rank_zero_only(tmp_path, rank):
    g = _graph()
    rank(1)
    assert not dist.is_main_process()
    g.save_checkpoint(tmp_path / "r1.safetensors")
    assert not (tmp_path / "r1.safetensors").exists()
    rank(0)
    g.save_checkpoint(tmp_path / "r0.safetensors")
    assert (tmp_path / "r0.safetensors").exists()


def test_monitor_on_other_ranks_prints_serves_and_writes_nothing(tmp_path, rank):
    from flowgraph.monitor import Monitor

    rank(1)
    out = io.StringIO()
    mon = Monitor(2, report_path=tmp_path / "report.html", stream=out)
    assert mon.main_process is False
    assert mon.serve(port=0) == ""
    mon.log(0, 0.1, {"loss": 1.0})
    mon.finish()
    assert out.getvalue() == ""
    assert mon.save_html(tmp_path / "x.html") == tmp_path / "x.html"
    mon.export_csv(tmp_path / "x.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    rank(0)
    out = io.StringIO()
    mon = Monitor(2, report_path=tmp_path / "report.html", stream=out, progress_bar=False)
    mon.log(0, 0.1, {"loss": 1.0})
    mon.finish()
    assert "loss" in out.getvalue() and (tmp_path / "report.html").exists()
