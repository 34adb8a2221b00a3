"""Shared fixtures: every backend-parametrised test runs once per available device.

CI runs NumPy and OpenCL/PoCL for real; CUDA and NVIDIA OpenCL run on the GPU machine. A device type that
is not available here is still collected and skipped with the reason, so a run shows what it did not test.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("POCL_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "flowgraph-pocl"))

from flowgraph.backends import available_devices  # noqa: E402

_AVAILABLE = available_devices()
_ALL_TYPES = ("cpu", "opencl", "cuda")


def _device_params():
    params = []
    for kind in _ALL_TYPES:
        found = [d for d in _AVAILABLE if d.split(":")[0] == kind]
        if found:
            # One device per type keeps the suite's time bounded; FLOWGRAPH_TEST_ALL_DEVICES=1 runs all.
            chosen = found if os.environ.get("FLOWGRAPH_TEST_ALL_DEVICES") else found[:1]
            params.extend(pytest.param(d, id=d) for d in chosen)
        else:
            params.append(
                pytest.param(kind, id=kind, marks=pytest.mark.skip(reason=f"no {kind} device available here"))
            )
    return params


DEVICE_PARAMS = _device_params()


@pytest.fixture(autouse=True)
def _exact_float32_convolutions():
    """Tests compare with torch's exact CPU float32: cuDNN's TF32 default (``fg.backends.cudnn.allow_tf32``,
    True as in PyTorch) would put 1e-3 relative errors into CUDA convolutions, so each test starts with it off
    (a test that wants it sets it) and the setting is put back after."""
    import flowgraph as fg

    saved = fg.backends.cudnn.allow_tf32
    fg.backends.cudnn.allow_tf32 = False
    yield
    fg.backends.cudnn.allow_tf32 = saved


@pytest.fixture(params=DEVICE_PARAMS)
def device(request) -> str:
    """A device string, one per available backend type."""
    return request.param
