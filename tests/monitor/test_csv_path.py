"""``Monitor(csv_path=...)``: the CSV of every epoch is written by finish() whatever the status, from a spool
on disk, so it holds every epoch even when memory holds a thinned history."""

from __future__ import annotations

import csv
import warnings

import pytest

from flowgraph.errors import FlowError
from flowgraph.monitor import Monitor


def rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_long_run_writes_every_epoch_although_memory_holds_few(tmp_path):
    target = tmp_path / "run.csv"
    mon = Monitor(1000, quiet=True, history_limit=20, csv_path=target)
    for epoch in range(1000):
        metrics = {"loss": 1.0 / (epoch + 1)}
        if epoch >= 500:
            metrics["val_loss"] = 2.0  # a metric that starts later gets its column
        mon.log(epoch, 0.01, metrics)
    assert len(mon.history) <= 20
    spool = [p for p in tmp_path.iterdir() if p.name.startswith(".run.csv.")]
    assert len(spool) == 1  # the full record is on disk while the run goes on
    mon.export_csv(tmp_path / "during.csv")  # from the spool: every epoch
    assert len(rows(tmp_path / "during.csv")) == 1000
    mon.finish()
    written = rows(target)
    assert [int(r["epoch"]) for r in written] == list(range(1, 1001))
    assert written[0]["val_loss"] == "" and written[-1]["val_loss"] == "2.0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["during.csv", "run.csv"]  # the spool is gone
    mon.export_csv(tmp_path / "after.csv")  # a copy of the full CSV
    assert len(rows(tmp_path / "after.csv")) == 1000


@pytest.mark.parametrize(("error", "status"), [(KeyboardInterrupt, "interrupted"), (RuntimeError, "failed")])
def test_the_csv_is_written_when_the_run_is_interrupted_or_fails(tmp_path, error, status):
    target = tmp_path / "run.csv"
    with pytest.raises(error):
        with Monitor(100, quiet=True, csv_path=target, report_path=tmp_path / "r.html") as mon:
            for epoch in range(100):
                mon.log(epoch, 0.01, {"loss": 1.0})
                if epoch == 9:
                    raise error("stop")
    assert mon.status == status
    assert len(rows(target)) == 10
    assert (tmp_path / "r.html").exists()


def test_without_csv_path_a_thinned_export_warns(tmp_path):
    mon = Monitor(100, quiet=True, history_limit=10)
    for epoch in range(100):
        mon.log(epoch, 0.01, {"loss": 1.0})
    with pytest.warns(RuntimeWarning, match="csv_path"):
        mon.export_csv(tmp_path / "x.csv")
    assert len(rows(tmp_path / "x.csv")) <= 10
    short = Monitor(5, quiet=True)
    short.log(0, 0.01, {"loss": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        short.export_csv(tmp_path / "y.csv")


def test_a_csv_path_in_a_missing_folder_is_refused_at_once(tmp_path):
    with pytest.raises(FlowError, match="does not exist"):
        Monitor(5, csv_path=tmp_path / "nope" / "run.csv")
