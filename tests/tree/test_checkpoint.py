"""Checkpoint round trips, subgraph loads, migration, every CheckpointError, and atomic writes under SIGKILL."""

import os
import random
import signal
import time

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.builder import FlowBuilder
from flowgraph.errors import CheckpointError

from .conftest import make_encoder, make_model


def _state(m):
    return {k: v.numpy().copy() for k, v in m.state_dict().items()}


def _assert_same(a, b):
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def test_full_round_trip_is_bit_exact(tmp_path, device):
    m = make_model(seed=1).to(device)
    m(fg.randn(8, 4, device=device))  # move BatchNorm statistics off their initial values
    path = tmp_path / "m.safetensors"
    m.save_checkpoint(path)
    other = make_model(seed=2).to(device)
    report = other.load_checkpoint(path)
    assert sorted(report.loaded) == sorted(m.state_dict()) and not report.skipped and not report.missing
    _assert_same(_state(m), _state(other))


def test_bfloat16_and_float64_entries_round_trip(tmp_path):
    m = FlowBuilder.from_(nn.Linear(3, 3)).through(nn.Linear(3, 3)).build()
    m.get_submodule("through_0").to(fg.float64)
    first = list(dict(m.named_children()))[0]
    m.get_submodule(first).to(fg.bfloat16)
    path = tmp_path / "d.safetensors"
    m.save_checkpoint(path)
    n = FlowBuilder.from_(nn.Linear(3, 3)).through(nn.Linear(3, 3)).build()
    n.get_submodule("through_0").to(fg.float64)
    n.get_submodule(first).to(fg.bfloat16)
    n.load_checkpoint(path)
    for (ka, a), (kb, b) in zip(m.state_dict().items(), n.state_dict().items()):
        assert a.dtype == b.dtype and np.array_equal(a.float().numpy(), b.float().numpy()), ka


def test_partial_load_reports(tmp_path):
    small = make_model(seed=1)
    path = tmp_path / "small.safetensors"
    small.save_checkpoint(path)
    bigger = (FlowBuilder.from_(make_encoder()).through(nn.BatchNorm1d(8)).tag("norm")
              .through(nn.Linear(8, 2)).tag("classifier").through(nn.Linear(2, 2)).tag("extra").build())
    with pytest.raises(CheckpointError):
        bigger.load_checkpoint(path)
    report = bigger.load_checkpoint(path, strict=False)
    assert report.missing == ["extra.weight", "extra.bias"]
    assert not report.skipped
    got, want = bigger.state_dict()["classifier.weight"], small.state_dict()["classifier.weight"]
    assert np.array_equal(got.numpy(), want.numpy())


def test_subgraph_checkpoint_survives_untagged_insertions_elsewhere(tmp_path):
    fg.manual_seed(5)
    encoder = make_encoder()
    path = tmp_path / "encoder_v1.safetensors"
    encoder.save_checkpoint(path)
    model = make_model(seed=9, extra_identity=True)
    report = model.load_subgraph_checkpoint("encoder", path)
    assert len(report.loaded) == 6
    sub = model.subgraph_at("encoder")
    _assert_same(_state(encoder), _state(sub))
    assert encoder.structural_hash() == sub.structural_hash()


def test_structural_hash_ignores_counters_but_sees_structure():
    assert make_model(seed=1).structural_hash() == make_model(seed=2).structural_hash()
    assert make_model().structural_hash() != make_model(extra_identity=True).structural_hash()


def test_optimizer_state_round_trip(tmp_path):
    x, y = fg.randn(16, 4), fg.randn(16, 2)

    def run(m, opt, steps):
        losses = []
        for _ in range(steps):
            loss = (m(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    a = make_model(seed=3)
    opt_a = optim.Adam(a.parameters(), lr=1e-2)
    run(a, opt_a, 5)
    path = tmp_path / "with_opt.safetensors"
    a.save_checkpoint(path, optimizer=opt_a)
    b = make_model(seed=4)
    opt_b = optim.Adam(b.parameters(), lr=1e-2)
    b.load_checkpoint(path, optimizer=opt_b)
    assert run(a, opt_a, 5) == run(b, opt_b, 5)


def test_migrate_tower_keeps_each_layer_in_place(tmp_path):
    def tower(with_front_identity):
        fb = FlowBuilder.from_(nn.Identity()) if with_front_identity else FlowBuilder()
        for _ in range(4):
            fb = fb.through(nn.Linear(6, 6))
        return fb.through(nn.Linear(6, 1)).tag("head").build()

    fg.manual_seed(0)
    old = tower(False)
    src = tmp_path / "old.safetensors"
    old.save_checkpoint(src)
    new = tower(True)
    dst = tmp_path / "new.safetensors"
    report = fg.migrate_checkpoint(src, dst, new)
    assert not report.missing and not report.dropped
    new.load_checkpoint(dst)
    old_w = [p.detach().numpy() for n, p in old.named_parameters() if n.endswith("weight")]
    new_w = [p.detach().numpy() for n, p in new.named_parameters() if n.endswith("weight")]
    for a, b in zip(old_w, new_w):
        assert np.array_equal(a, b)
    assert "head.weight" in report.unchanged


def _corrupt(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "garbage":
        path.write_bytes(b"not a checkpoint at all" * 3)
    elif how == "header":
        data[10:30] = b"#" * 20
        path.write_bytes(bytes(data))
    elif how == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncate", "garbage", "header", "empty"])
def test_corrupt_files_raise_checkpoint_error(tmp_path, how):
    m = make_model()
    path = tmp_path / "c.safetensors"
    m.save_checkpoint(path)
    _corrupt(path, how)
    with pytest.raises(CheckpointError):
        m.load_checkpoint(path)


def test_checkpoint_error_catalogue(tmp_path):
    m = make_model()
    path = tmp_path / "m.safetensors"
    m.save_checkpoint(path)
    with pytest.raises(CheckpointError, match="no such|cannot read"):
        m.load_checkpoint(tmp_path / "missing.safetensors")
    other = (FlowBuilder.from_(make_encoder()).through(nn.BatchNorm1d(8)).tag("norm")
             .through(nn.Linear(8, 3)).tag("classifier").build())
    with pytest.raises(CheckpointError, match="different structure"):
        other.load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"classifier.weight.*\(2, 8\).*\(3, 8\)"):
        other.load_checkpoint(path, check_structure=False)
    with pytest.raises(CheckpointError, match="no optimizer state"):
        m.load_checkpoint(path, optimizer=optim.SGD(m.parameters(), lr=0.1))
    from safetensors.numpy import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(plain))
    with pytest.raises(CheckpointError, match="not a flowgraph checkpoint"):
        m.load_checkpoint(plain)


def test_failed_strict_load_changes_nothing(tmp_path):
    m = make_model(seed=1)
    path = tmp_path / "m.safetensors"
    m.save_checkpoint(path)
    other = (FlowBuilder.from_(make_encoder()).through(nn.BatchNorm1d(8)).tag("norm")
             .through(nn.Linear(8, 2)).tag("classifier").through(nn.Linear(2, 2)).build())
    before = _state(other)
    with pytest.raises(CheckpointError):
        other.load_checkpoint(path, check_structure=False)
    _assert_same(before, _state(other))


def test_sigkill_mid_write_never_corrupts_the_target(tmp_path):
    """A child process saving in a loop is SIGKILLed at random points 100 times; the target file is
    always absent or a complete, loadable checkpoint."""
    fg.manual_seed(0)
    big = FlowBuilder.from_(nn.Linear(256, 512)).through(nn.Linear(512, 256)).build()
    target = tmp_path / "target.safetensors"
    rng = random.Random(0)
    kills_mid_write = 0
    for _ in range(100):
        pid = os.fork()
        if pid == 0:  # child: save forever until killed
            try:
                while True:
                    big.save_checkpoint(target)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.02))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        kills_mid_write += bool(leftovers)
        for p in leftovers:
            p.unlink()
        if target.exists():
            fresh = FlowBuilder.from_(nn.Linear(256, 512)).through(nn.Linear(512, 256)).build()
            fresh.load_checkpoint(target)
            _assert_same(_state(big), _state(fresh))
    assert kills_mid_write > 0, "no kill landed during a write; the test did not exercise the atomic path"
