"""Hypothesis strategies and comparison helpers shared by the tensor and autograd tests.

Arrays are drawn as a shape plus a seed (NumPy fills the values): far faster than element-wise strategies,
and the shapes, which is where the bugs live (0-d, empty, broadcasting), are still searched by Hypothesis.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flowgraph as fg

#: Moderate example counts: the whole suite must stay fast on 2 cores. ``device`` is a plain string
#: fixture, so reusing it across examples is safe.
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

#: Shapes from 0-d up to 4-d, sides 0..4 (empty tensors included).
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
#: Non-empty shapes (for ops with no identity on empty input).
nonempty_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4)
#: Two shapes that broadcast together, and their result shape.
broadcast_pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4)
seeds = st.integers(0, 2**31 - 1)

FG_DTYPES = {
    "float16": fg.float16, "bfloat16": fg.bfloat16, "float32": fg.float32, "float64": fg.float64,
    "int32": fg.int32, "int64": fg.int64, "bool": fg.bool,
}
TORCH_DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}


def data(shape, seed: int, low: float = -3.0, high: float = 3.0, dtype=np.float32) -> np.ndarray:
    """Deterministic values for a shape: uniform in [low, high), cast to ``dtype``."""
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(dtype)


def int_data(shape, seed: int, low: int = -5, high: int = 6, dtype=np.int64) -> np.ndarray:
    """Deterministic integers in [low, high)."""
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(dtype)


def fgt(array: np.ndarray, device: str, requires_grad: bool = False) -> fg.Tensor:
    """A flowgraph tensor with exactly the array's dtype."""
    return fg.tensor(array, dtype=array.dtype if array.dtype != np.bool_ else fg.bool, device=device,
                     requires_grad=requires_grad)


def tt(array: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    """A torch tensor copying the array."""
    return torch.tensor(array, requires_grad=requires_grad)


def host(x) -> np.ndarray:
    """Values of a flowgraph or torch tensor (or anything array-like) as a NumPy array; bfloat16 as float32."""
    if isinstance(x, fg.Tensor):
        x = x.detach()
        if x.dtype == fg.bfloat16:
            x = x.float()
        return np.asarray(x.numpy())
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def same_dtype(out: fg.Tensor, ref: torch.Tensor) -> None:
    """Assert a flowgraph tensor has the torch tensor's dtype."""
    assert out.dtype.name == str(ref.dtype).removeprefix("torch."), f"dtype {out.dtype} vs torch {ref.dtype}"


def close(out, ref, rtol: float = 1e-5, atol: float = 1e-6, check_dtype: bool = True) -> None:
    """Assert shape, (torch) dtype and values agree; NaNs must sit at the same places."""
    a, b = host(out), host(ref)
    assert a.shape == b.shape, f"shape {a.shape} vs {b.shape}"
    if check_dtype and isinstance(out, fg.Tensor) and isinstance(ref, torch.Tensor):
        same_dtype(out, ref)
    if a.dtype == np.bool_ or b.dtype == np.bool_ or a.dtype.kind in "iu":
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)


def skip_if_no_float64(device: str) -> None:
    """Skip (with the reason) on devices without float64."""
    import pytest

    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} does not support float64")


_DTYPE_SUPPORT: dict[tuple[str, str], str | None] = {}


def unsupported_dtype(device: str, *names: str) -> str | None:
    """The reason one of these dtypes cannot live on ``device`` (the backend's BackendError), or None."""
    for name in names:
        key = (device, name)
        if key not in _DTYPE_SUPPORT:
            try:
                fg.zeros(1, dtype=FG_DTYPES[name], device=device).to(fg.float32).tolist()
                _DTYPE_SUPPORT[key] = None
            except fg.BackendError as exc:
                _DTYPE_SUPPORT[key] = str(exc)
        if _DTYPE_SUPPORT[key] is not None:
            return _DTYPE_SUPPORT[key]
    return None


def skip_unless_dtypes(device: str, *names: str) -> None:
    """Skip (with the backend's reason) unless ``device`` supports every named dtype."""
    import pytest

    reason = unsupported_dtype(device, *names)
    if reason is not None:
        pytest.skip(reason)
