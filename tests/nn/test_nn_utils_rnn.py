"""nn.utils.rnn.pad_sequence and Module.bfloat16 against torch (issue #18)."""

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph import nn
from flowgraph.nn.utils.rnn import pad_sequence


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_matches_torch(device, batch_first, padding_side):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 4, 1)]
    seqs = [fg.tensor(a, device=device).requires_grad_() for a in arrays]
    out = pad_sequence(seqs, batch_first=batch_first, padding_value=-1.5, padding_side=padding_side)
    tseqs = [torch.tensor(a, requires_grad=True) for a in arrays]
    ref = torch.nn.utils.rnn.pad_sequence(tseqs, batch_first=batch_first, padding_value=-1.5,
                                          padding_side=padding_side)
    assert out.shape == tuple(ref.shape) and out.device == seqs[0].device
    np.testing.assert_array_equal(out.detach().numpy(), ref.detach().numpy())
    w = rng.standard_normal(tuple(ref.shape)).astype(np.float32)
    (out * fg.tensor(w, device=device)).sum().backward()
    (ref * torch.tensor(w)).sum().backward()
    for s, ts in zip(seqs, tseqs):
        np.testing.assert_array_equal(s.grad.numpy(), ts.grad.numpy())


def test_pad_sequence_one_dim_ints(device):
    seqs = [fg.tensor([1, 2, 3], device=device), fg.tensor([4], device=device)]
    ref = torch.nn.utils.rnn.pad_sequence([torch.tensor([1, 2, 3]), torch.tensor([4])])
    out = pad_sequence(seqs)
    assert out.dtype == fg.int64
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


def test_pad_sequence_bad_input(device):
    with pytest.raises(fg.FlowError, match="padding_side must be 'right' or 'left'"):
        pad_sequence([fg.zeros(2, device=device)], padding_side="middle")
    with pytest.raises(fg.ShapeError, match=r"sequences\[1\] has trailing shape"):
        pad_sequence([fg.zeros(2, 3, device=device), fg.zeros(2, 4, device=device)])
    with pytest.raises(fg.FlowError, match="sequences is empty"):
        pad_sequence([])


def test_module_bfloat16(device):
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).to(device)
    if device.startswith("opencl"):  # the OpenCL backend has no bfloat16 arrays: the cast says so
        with pytest.raises(fg.BackendError, match="bfloat16 is not supported on OpenCL"):
            m.bfloat16()
        return
    assert m.bfloat16() is m
    assert all(p.dtype == fg.bfloat16 for p in m.parameters())
    assert m[1].running_mean.dtype == fg.bfloat16
    assert m[1].num_batches_tracked.dtype == fg.int64  # integer buffers keep their dtype, as in torch
    ref = torch.nn.Linear(3, 2).bfloat16()
    assert ref.weight.dtype == torch.bfloat16
