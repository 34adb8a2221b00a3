"""Checkpoints detect corruption and refuse what does not belong to the model, with a CheckpointError naming it."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save

import flowgraph as fg
from flowgraph import nn, optim
from flowgraph.tree import checkpoint as ckpt


def _model():
    fg.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def _rewrite(path, change):
    """Rewrite a checkpoint's tensors/metadata through ``change(tensors, metadata)`` (checksums left as they are
    unless ``change`` updates them)."""
    with safe_open(str(path), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = dict(f.metadata())
    change(tensors, metadata)
    with open(path, "wb") as fh:
        fh.write(save(tensors, metadata=metadata))


def _data_offset(path) -> int:
    with open(path, "rb") as fh:
        return 8 + int.from_bytes(fh.read(8), "little")


def test_a_flipped_byte_in_the_data_is_detected(tmp_path):
    path = tmp_path / "m.safetensors"
    ckpt.save_checkpoint(_model(), path)
    raw = bytearray(path.read_bytes())
    raw[_data_offset(path) + 5] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(fg.CheckpointError, match=r"key '.*' does not match its checksum"):
        ckpt.load_checkpoint(_model(), path)


def test_data_replaced_by_nan_is_detected(tmp_path):
    path = tmp_path / "m.safetensors"
    ckpt.save_checkpoint(_model(), path)
    _rewrite(path, lambda t, m: t.__setitem__("0.weight", np.full_like(t["0.weight"], np.nan)))
    with pytest.raises(fg.CheckpointError, match="'0.weight' does not match its checksum"):
        ckpt.load_checkpoint(_model(), path)


def _with_checksums(tensors, metadata):
    metadata["checksums"] = json.dumps({k: ckpt.checksum(v) for k, v in tensors.items()})


def test_integer_or_bool_data_for_a_float_parameter_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    ckpt.save_checkpoint(_model(), path)

    def to_bool(t, m):
        t["0.weight"] = np.ones(t["0.weight"].shape, dtype=bool)
        dtypes = json.loads(m["dtypes"])
        dtypes["0.weight"] = "bool"
        m["dtypes"] = json.dumps(dtypes)
        _with_checksums(t, m)

    _rewrite(path, to_bool)
    with pytest.raises(fg.CheckpointError, match="'0.weight' holds bool data but the model's tensor is .*float32"):
        ckpt.load_checkpoint(_model(), path)


def test_stored_dtype_must_match_the_dtype_metadata(tmp_path):
    path = tmp_path / "m.safetensors"
    ckpt.save_checkpoint(_model(), path)

    def lie(t, m):
        t["0.bias"] = np.zeros(6, dtype=np.uint8)
        dtypes = json.loads(m["dtypes"])
        dtypes["0.bias"] = "bfloat16"
        m["dtypes"] = json.dumps(dtypes)
        _with_checksums(t, m)

    _rewrite(path, lie)
    with pytest.raises(fg.CheckpointError, match="'0.bias' is stored as uint8 but its metadata says bfloat16"):
        ckpt.read_checkpoint(path)


@pytest.mark.parametrize("field, value", [("dtypes", "{not json"), ("checksums", "[1, 2]"),
                                          ("optimizer", '{"state": 5}')])
def test_crafted_metadata_gives_a_checkpoint_error(tmp_path, field, value):
    path = tmp_path / "m.safetensors"
    model = _model()
    opt = optim.Adam(model.parameters())
    model(fg.randn(2, 4)).sum().backward()
    opt.step()
    ckpt.save_checkpoint(model, path, optimizer=opt)
    _rewrite(path, lambda t, m: m.__setitem__(field, value))
    with pytest.raises(fg.CheckpointError, match=field):
        ckpt.load_checkpoint(_model(), path, optimizer=optim.Adam(_model().parameters()))


def test_optimizer_state_of_the_wrong_shape_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    model = _model()
    opt = optim.Adam(model.parameters())
    model(fg.randn(2, 4)).sum().backward()
    opt.step()
    ckpt.save_checkpoint(model, path, optimizer=opt)

    def reshape_state(t, m):
        key = next(k for k in t if k.startswith("@optimizer/state/0/exp_avg"))
        t[key] = np.zeros((7,), dtype=np.float32)
        _with_checksums(t, m)

    _rewrite(path, reshape_state)
    fresh = _model()
    with pytest.raises(fg.CheckpointError, match="optimizer state 'exp_avg' of parameter #0 has shape"):
        ckpt.load_checkpoint(fresh, path, optimizer=optim.Adam(fresh.parameters()))


def test_non_regular_files_are_refused(tmp_path):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(fg.CheckpointError, match="not a regular file"):
        ckpt.read_checkpoint(fifo)
    with pytest.raises(fg.CheckpointError, match="not a regular file"):
        ckpt.read_checkpoint("/dev/zero")


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path):
    path = tmp_path / "m.safetensors"
    dead = tmp_path / ".m.safetensors.999999999.abcd.tmp"  # no such process
    live = tmp_path / f".m.safetensors.{os.getppid()}.efgh.tmp"  # a writer that is still running
    other = tmp_path / ".other.safetensors.999999999.abcd.tmp"  # another target: not ours to touch
    for p in (dead, live, other):
        p.write_bytes(b"x" * 100)
    ckpt.save_checkpoint(_model(), path)
    assert not dead.exists() and live.exists() and other.exists()


def test_files_honour_the_umask(tmp_path):
    path = tmp_path / "m.safetensors"
    old = os.umask(0o027)
    try:
        ckpt.save_checkpoint(_model(), path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_structure_mismatch_prints_digits_that_differ():
    assert ckpt._differing("abcdef1234567890aa", "abcdef1234567890bb") == \
        "abcdef1234567890aa vs this model's abcdef1234567890bb"
    assert ckpt._differing("123456789012x", "123456789012y").startswith("123456789012x")


def test_checksum_changes_with_any_single_byte():
    arr = np.arange(37, dtype=np.uint8)  # a tail that is not a whole 8-byte word
    base = ckpt.checksum(arr)
    for i in range(arr.size):
        flipped = arr.copy()
        flipped[i] ^= 1
        assert ckpt.checksum(flipped) != base


def test_optimizer_with_non_tensor_state_gets_a_clear_error(tmp_path):
    """LBFGS keeps lists of tensors: save_checkpoint names the entry and points at fg.save, which stores it."""
    from flowgraph.errors import CheckpointError
    from flowgraph.tree import save_checkpoint

    model = nn.Linear(3, 1)
    opt = optim.LBFGS(model.parameters(), history_size=3, max_iter=3)
    x = fg.randn(4, 3)

    def closure():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    opt.step(closure)
    with pytest.raises(CheckpointError, match=r"optimizer state '.*' of parameter #0 .*fg\.save"):
        save_checkpoint(model, tmp_path / "m.safetensors", optimizer=opt)
    assert not (tmp_path / "m.safetensors").exists()
    fg.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "state.fg")
    back = fg.load(tmp_path / "state.fg")
    assert set(back["optimizer"]["state"][0]) == set(opt.state_dict()["state"][0])
