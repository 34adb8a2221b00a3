"""The benchmark's torch.compile column: the compiled model is what the variant trains, and a model that does
not compile is reported and leaves the other columns running. ``torch.compile`` itself is replaced here (its
first call takes tens of seconds and needs a C++ compiler); the device runs time the real one."""

import json

import pytest

torch = pytest.importorskip("torch")

from benchmarks import __main__ as bench  # noqa: E402

ARGS = ["--device", "cpu", "--models", "mlp", "--rounds", "1", "--epochs", "1", "--steps", "2", "--compile"]


def _run(tmp_path, capsys, extra=()):
    out = tmp_path / "bench.json"
    assert bench.main([*ARGS, *extra, "--json", str(out)]) == 0
    printed = capsys.readouterr()
    return json.loads(out.read_text())["results"][0], printed


def test_compile_variant_trains_the_compiled_model(tmp_path, capsys, monkeypatch):
    compiled = []

    def fake_compile(model, mode=None):
        calls = []

        def forward(x):
            calls.append(x.shape)
            return model(x)

        compiled.append((mode, calls))
        return forward

    monkeypatch.setattr(torch, "compile", fake_compile)
    result, printed = _run(tmp_path, capsys, ["--jit", "--compile-mode", "reduce-overhead"])
    assert len(compiled) == 1  # the torch_compile variant only: eager torch trains the plain model
    mode, calls = compiled[0]
    assert mode == "reduce-overhead"
    assert len(calls) >= 2 * 2  # the warm-up epoch and the timed one, two steps each, through it
    assert result["torch_compile"]["median_ms"] > 0
    header, row = [line for line in printed.out.splitlines() if not line.startswith("#")][:2]
    assert "torch compile" in header and "jit/compile" in header
    ratio = result["flowgraph_jit"]["median_ms"] / result["torch_compile"]["median_ms"]
    assert row.split()[-3] == f"{ratio:.2f}"  # fg jit / torch.compile, before the two memory columns


def test_a_model_that_does_not_compile_is_reported_and_the_rest_runs(tmp_path, capsys, monkeypatch):
    def failing_compile(model, mode=None):
        def forward(x):
            raise RuntimeError("no C++ compiler here")

        return forward

    monkeypatch.setattr(torch, "compile", failing_compile)
    result, printed = _run(tmp_path, capsys)
    assert "torch_compile" not in result
    assert result["flowgraph"]["median_ms"] > 0 and result["torch"]["median_ms"] > 0
    assert "mlp/torch_compile: could not run (RuntimeError: no C++ compiler here)" in printed.err
    row = [line for line in printed.out.splitlines() if line.startswith("mlp")][0]
    assert "nan" in row.split()  # the compile column reads nan
