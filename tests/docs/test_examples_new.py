"""The quickstart, sine_wave, mixed_precision and schedulers examples run (small epoch counts) and do what
they claim. (``tests/examples/test_examples.py`` checks every example's ``--help`` and ``--device`` flag.)"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import pytest

import flowgraph as fg

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(rel: str):
    """Import an example script as a module (its ``main()`` does not run)."""
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(f"example_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_learns_the_spirals():
    result = load("examples/quickstart/train.py").train(epochs=8, verbose=False)
    assert result["final_loss"] < 0.5 * result["first_loss"]
    assert result["accuracy"] > 0.9
    assert len(result["losses"]) == 8


def test_sine_wave_fits_logs_and_round_trips_its_checkpoint(tmp_path):
    result = load("examples/sine_wave/train.py").train(epochs=12, workdir=str(tmp_path), verbose=False)
    assert result["final_loss"] < 0.5 * result["first_loss"]
    assert result["epochs_logged"] == 12                     # the monitor logged every epoch
    assert pathlib.Path(result["checkpoint"]).exists()
    assert result["loaded"] == 6 and result["max_diff"] == 0.0   # the reloaded model predicts identically
    assert result["optimizer_steps"] == 12 * 8               # optimizer state came back too
    assert "flowgraph-report" in pathlib.Path(result["report"]).read_text()
    assert result["url"] is None


def test_sine_wave_serves_the_dashboard(tmp_path):
    module = load("examples/sine_wave/train.py")
    result = module.train(epochs=3, serve=True, port=0, workdir=str(tmp_path), verbose=False)
    assert result["url"].startswith("http://127.0.0.1:")
    assert result["epochs_logged"] == 3


def test_mixed_precision_bfloat16_trains_like_float32():
    result = load("examples/mixed_precision/train.py").train(epochs=4, dtype="bfloat16", verbose=False)
    mixed, reference = result["mixed"], result["float32"]
    assert mixed["output_dtype"] is fg.bfloat16 and mixed["param_dtype"] is fg.float32
    assert mixed["final_loss"] < 0.5 * mixed["first_loss"]
    assert math.isclose(mixed["final_loss"], reference["final_loss"], rel_tol=0.2)
    assert mixed["skipped_steps"] == 0


def test_gradients_keep_their_inputs_dtype_under_type_promotion():
    # What the float16 example relies on (as in PyTorch): the gradient reaching a float16 tensor through a
    # promoting op (float16 - float32 -> float32) is float16, so autocast's backward runs in float16 and an
    # overflow shows up as inf for GradScaler. The cast lives in flowgraph/autograd/node.py (run_backward).
    a = fg.ones(3, requires_grad=True).to(fg.float16)
    a.retain_grad()
    ((a - fg.zeros(3)) * 1e30).sum().backward()
    assert a.grad.dtype is fg.float16, "the gradient of a float16 input came back as " + a.grad.dtype.name
    assert not bool(a.grad.isfinite().any())


def test_mixed_precision_float16_scaler_skips_overflowing_steps_and_recovers():
    # A first loss scale of 2**30 overflows float16 gradients: the scaler must skip those steps, lower the
    # scale, and then train normally.
    result = load("examples/mixed_precision/train.py").train(epochs=6, dtype="float16", init_scale=2.0 ** 30,
                                                            verbose=False)
    mixed = result["mixed"]
    assert mixed["output_dtype"] is fg.float16
    assert mixed["skipped_steps"] >= 1
    assert mixed["scale"] < 2.0 ** 30
    assert mixed["final_loss"] < 0.5 * mixed["first_loss"]


def test_schedulers_follow_their_curves():
    module = load("examples/schedulers/train.py")
    results = module.train(epochs=20, verbose=False)
    assert set(results) == {"constant", "step", "warmup_cosine", "one_cycle", "plateau"}
    base = module.BASE_LR
    assert results["constant"]["lrs"] == [base] * 20
    assert results["step"]["lrs"][::5] == pytest.approx([base, base / 2, base / 4, base / 8])
    warm = results["warmup_cosine"]["lrs"]
    peak = warm.index(max(warm))
    assert warm[0] == pytest.approx(base * 0.1) and max(warm) == pytest.approx(base)
    assert all(a < b for a, b in zip(warm[:peak], warm[1:peak + 1]))          # warm-up rises
    assert all(a >= b for a, b in zip(warm[peak:], warm[peak + 1:]))          # cosine decays
    cycle = results["one_cycle"]["lrs"]
    assert max(cycle) > cycle[0] and max(cycle) > cycle[-1]
    plateau = results["plateau"]["lrs"]
    assert plateau[0] == base and plateau[-1] < base                          # reduced at least once
    for result in results.values():
        assert result["final_loss"] < result["first_loss"]
    json.dumps(results)                                                        # plain numbers only


def test_schedulers_reject_an_unknown_schedule():
    with pytest.raises(fg.FlowError, match="unknown schedule 'cosine'"):
        load("examples/schedulers/train.py").train(epochs=2, schedules=["cosine"], verbose=False)
