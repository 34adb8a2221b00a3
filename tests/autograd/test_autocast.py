"""fg.autocast: matmul-like ops in low precision, reductions/softmax in float32, float32 gradients."""

import numpy as np
import pytest

import flowgraph as fg
from flowgraph import nn
from flowgraph.errors import FlowError


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_autocast_dtypes_and_gradients(device, dtype):
    bk = fg.get_backend(device)
    if dtype == "float16" and not bk.supports_float16:
        pytest.skip(f"{device} has no float16")
    if dtype == "bfloat16" and device.startswith("opencl"):
        pytest.skip("bfloat16 is not supported on OpenCL")
    low = getattr(fg, dtype)
    fg.manual_seed(0)
    m = nn.Linear(8, 4).to(device)
    x = fg.randn(6, 8, device=device)
    with fg.autocast(low):
        assert fg.is_autocast_enabled()
        y = m(x)
        assert y.dtype is low
        assert y.softmax(-1).dtype is fg.float32 and y.sum().dtype is fg.float32 and y.mean().dtype is fg.float32
        loss = y.sum()
    assert not fg.is_autocast_enabled()
    loss.backward()
    assert m.weight.grad.dtype is fg.float32 and m.weight.dtype is fg.float32
    ref = m(x).detach().numpy()
    np.testing.assert_allclose(y.float().detach().numpy(), ref, rtol=5e-2, atol=5e-2)


def test_autocast_rejects_float32():
    with pytest.raises(FlowError, match="float16 or bfloat16"):
        fg.autocast(fg.float32)


def test_autocast_disabled_is_a_no_op():
    m = nn.Linear(3, 2)
    with fg.autocast(fg.float16, enabled=False):
        assert m(fg.randn(2, 3)).dtype is fg.float32
