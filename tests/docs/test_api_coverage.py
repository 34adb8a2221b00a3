"""The API coverage table in docs/migration.md is current (``tools/api_coverage.py --check``), and the
checker itself tells available, renamed, deliberately absent and missing names apart."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "api_coverage.py"


@pytest.fixture(scope="module")
def cov():
    spec = importlib.util.spec_from_file_location("api_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_coverage"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["api_coverage"]


def test_coverage_table_in_migration_guide_is_current():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_check_fails_on_a_stale_table(cov, tmp_path):
    doc = tmp_path / "migration.md"
    current = (ROOT / "docs" / "migration.md").read_text()
    doc.write_text(current.replace("| all (distinct names) |", "| all (distinct names, edited) |"))
    assert cov.main(["--check"], doc_path=doc) == 1
    assert cov.main(["--write"], doc_path=doc) == 0
    assert doc.read_text() == current
    assert cov.main(["--check"], doc_path=doc) == 0


def test_lookup_rules(cov):
    assert cov.provided("flowgraph.nn.Linear")
    assert cov.provided("flowgraph.nn.functional.cross_entropy")
    assert cov.provided("flowgraph.nn.Module.training")  # set in __init__: found on an instance
    assert cov.provided("flowgraph.optim.Optimizer.param_groups")
    assert cov.provided("flowgraph.Tensor.sum(dim=)")
    assert not cov.provided("flowgraph.Tensor.sum(no_such_keyword=)")
    assert not cov.provided("flowgraph.nn.NoSuchLayer")
    assert not cov.provided("flowgraph.no_such_module.thing")
    assert not cov.provided("flowgraph.dtype")  # a flowgraph module of that name is no counterpart of torch.dtype
    import json

    import flowgraph.nn

    assert cov._inside(flowgraph.nn, "flowgraph") and not cov._inside(json, "flowgraph")
    assert cov.counterpart("torch.nn.functional.relu") == "flowgraph.nn.functional.relu"
    assert cov.group_of("torch.nn.functional.relu") == "torch.nn.functional"
    assert cov.group_of("torch.nn.Module.eval") == "torch.nn.Module"
    assert cov.group_of("torch.cat") == "torch"


def test_classify_reports_stale_and_wrong_reasons(cov):
    programs = {"prog": ["torch.nn.Linear", "torch.no_such_function", "torch.cuda.amp.GradScaler",
                         "torch.other_missing"]}
    reasons = cov.Reasons(renamed={"torch.cuda.amp.GradScaler": "flowgraph.optim.GradScaler",
                                   "torch.other_missing": "flowgraph.not_there"},
                          not_provided={"torch.nn.Linear": "stale", "torch.no_such_function": "on purpose",
                                        "torch.not_in_yardstick": "x"})
    rows, problems = cov.classify(programs, reasons)
    status = {r.name: (r.status, r.note) for r in rows}
    assert status == {"torch.nn.Linear": ("available", ""),
                      "torch.no_such_function": ("not provided", "on purpose"),
                      "torch.cuda.amp.GradScaler": ("other name", "fg.optim.GradScaler"),
                      "torch.other_missing": ("missing", "")}
    assert len(problems) == 3
    assert any("torch.nn.Linear: flowgraph now provides fg.nn.Linear" in p for p in problems)
    assert any("flowgraph.not_there does not exist" in p for p in problems)
    assert any("torch.not_in_yardstick" in p for p in problems)


def test_yardstick_and_reasons_files(cov):
    programs = cov.read_yardstick()
    assert list(programs) == ["nanoGPT", "minGPT", "makemore", "pytorch/examples", "timm"]
    distinct = {n for names in programs.values() for n in names}
    assert len(distinct) > 300 and all(n.startswith("torch.") for n in distinct)
    for names in programs.values():
        assert names == sorted(set(names)), "one sorted block per program, no repeats"
    reasons = cov.read_reasons()
    _, problems = cov.classify(programs, reasons)
    assert problems == []
    assert all(isinstance(v, list) and v for v in reasons.guide.values())


def test_splice_needs_both_markers_once(cov):
    with pytest.raises(ValueError, match="coverage:start"):
        cov.splice("no markers here", "table")
    assert cov.splice(f"a\n{cov.START}\nold\n{cov.END}\nb", "new") == f"a\n{cov.START}\nnew\n{cov.END}\nb"


def test_yardstick_scan_resolves_aliases_and_attributes():
    spec = importlib.util.spec_from_file_location("api_yardstick_scan", ROOT / "tools" / "api_yardstick_scan.py")
    scan_tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scan_tool)
    source = (
        "import torch\nimport torch.nn as nn\nfrom torch.nn import functional as F\n"
        "from torch.utils.data.dataloader import DataLoader\n"
        "class M(nn.Module):\n"
        "    def forward(self, x):\n"
        "        y = F.relu(torch.zeros(3).view(1, 3)).split(1)\n"
        "        return ' a b'.strip(), DataLoader, torch.nn.init.normal_, torch.float32,\\\n"
        "            torch.nn.Linear(2, 2).weight\n")
    classes = {"torch.Tensor": {"view", "split", "strip"}, "torch.nn.Module": {"forward"}}
    found = scan_tool.scan(source, classes)
    assert {"torch.nn.Module", "torch.nn.functional.relu", "torch.zeros", "torch.nn.init.normal_",
            "torch.float32", "torch.Tensor.view", "torch.Tensor.split",
            "torch.utils.data.dataloader.DataLoader"} <= found
    assert "torch.Tensor.strip" in found  # untyped: a str method of a name torch.Tensor had would count
    assert "torch.nn.Linear" in found and not any(n.endswith(".weight") for n in found)  # result attributes cut
    assert scan_tool.public_name("torch.utils.data.dataloader.DataLoader") == "torch.utils.data.DataLoader"
    assert scan_tool.public_name("torch.nn.modules.linear.Linear") == "torch.nn.Linear"
    assert scan_tool.resolve("torch.no_such_name") is None
