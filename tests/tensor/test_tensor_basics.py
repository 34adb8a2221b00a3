"""Tensor basics: properties, host exchange (item/numpy/tolist/DLPack), ``to``, repr, devices, errors, import cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import flowgraph as fg

from .strategies import close, host, skip_unless_dtypes, unsupported_dtype

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_properties(device):
    x = fg.zeros(2, 3, 4, device=device)
    assert x.shape == (2, 3, 4) and x.size() == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4
    assert x.ndim == 3 and x.dim() == 3 and x.numel() == 24 and len(x) == 2
    assert x.dtype is fg.float32 and x.device == fg.device(device)
    assert x.is_leaf and x.grad_fn is None and x.grad is None and not x.requires_grad
    with pytest.raises(TypeError, match="0-d"):  # as torch
        len(fg.tensor(1.0, device=device))
    with pytest.raises(fg.FlowError, match="out of range"):
        x.size(3)


def test_item_numpy_tolist(device):
    assert fg.tensor(2.5, device=device).item() == 2.5
    assert fg.tensor([[7]], device=device).item() == 7
    assert isinstance(fg.tensor(3, device=device).item(), int)
    assert isinstance(fg.tensor(True, device=device).item(), bool)
    with pytest.raises(fg.FlowError, match="single-element"):
        fg.zeros(2, device=device).item()
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    arr = x.numpy()
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32 and arr.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert fg.tensor(5, device=device).tolist() == 5
    assert fg.zeros(0, 2, device=device).tolist() == []
    with pytest.raises(fg.FlowError, match="detach"):
        fg.zeros(2, requires_grad=True, device=device).numpy()
    assert float(fg.tensor(1.5, device=device)) == 1.5 and int(fg.tensor(3.7, device=device)) == 3
    assert bool(fg.tensor(1, device=device)) and not bool(fg.tensor(0.0, device=device))
    with pytest.raises(fg.FlowError, match="ambiguous"):
        bool(fg.zeros(2, device=device))
    assert [10, 20, 30][fg.tensor(1, device=device)] == 20  # __index__
    with pytest.raises(fg.FlowError):
        [1, 2][fg.tensor(1.0, device=device)]
    if unsupported_dtype(device, "bfloat16") is None:
        assert fg.tensor([1.0, 2.0], dtype=fg.bfloat16, device=device).tolist() == [1.0, 2.0]


def test_numpy_shares_memory_on_cpu():
    x = fg.zeros(3)
    x.numpy()[1] = 5.0
    assert x[1].item() == 5.0


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool", "float16"])
def test_dlpack_round_trip_numpy_and_torch(dtype):
    x = fg.tensor(np.arange(6).reshape(2, 3) % 2, dtype=getattr(fg, dtype))
    as_np = np.from_dlpack(x)
    np.testing.assert_array_equal(as_np, host(x))
    as_torch = torch.from_dlpack(x)
    assert str(as_torch.dtype) == f"torch.{dtype}"
    np.testing.assert_array_equal(as_torch.numpy(), host(x))
    back = fg.from_dlpack(as_torch)
    assert back.dtype is x.dtype and back.tolist() == x.tolist()
    from_np = fg.from_dlpack(np.ascontiguousarray(host(x)))
    assert from_np.tolist() == x.tolist()


def test_dlpack_is_zero_copy():
    t = torch.zeros(4)
    x = fg.from_dlpack(t)
    t[2] = 3.0
    assert x[2].item() == 3.0
    y = fg.zeros(3)
    ty = torch.from_dlpack(y)
    y[0] = 9.0
    assert ty[0].item() == 9.0
    assert x.__dlpack_device__()[0] == 1
    with pytest.raises(fg.FlowError):
        fg.from_dlpack([1, 2, 3])


def test_to_device_dtype(device):
    skip_unless_dtypes(device, "float16")
    x = fg.tensor([1.5, 2.5], device="cpu")
    y = x.to(device)
    assert y.device == fg.device(device) and y.tolist() == [1.5, 2.5]
    assert x.to("cpu") is x
    z = x.to(device, fg.float16)
    assert z.dtype is fg.float16 and z.device == fg.device(device)
    w = x.to(dtype=fg.int64)
    assert w.tolist() == [1, 2]
    assert x.to(fg.zeros(1, dtype=fg.int32, device=device)).dtype is fg.int32
    assert x.to(torch.float16).dtype is fg.float16
    c = x.to(fg.float32, copy=True)
    assert c is not x and c.tolist() == x.tolist()
    assert y.cpu().device == "cpu"
    with pytest.raises(fg.FlowError):
        x.to(bogus=1)


def test_device_parse_errors():
    with pytest.raises(fg.BackendError, match="unknown device 'nope'"):
        fg.zeros(2, device="nope")
    with pytest.raises(fg.BackendError, match="index"):
        fg.zeros(2, device="cpu:1")
    with pytest.raises(fg.BackendError, match="non-negative integer"):
        fg.zeros(2, device="cuda:x")
    with pytest.raises(RuntimeError):  # BackendError is a RuntimeError
        fg.tensor([1.0], device="tpu")
    assert fg.device("cpu") == "cpu" and fg.device("cuda") == "cuda:0" and fg.device("OpenCL:1") == "opencl:1"
    assert "cpu" in fg.available_devices()


def _two_devices():
    devices = fg.available_devices()
    return devices if len(devices) >= 2 else None


def test_cross_device_ops_are_errors():
    devices = _two_devices()
    if devices is None:
        pytest.skip("needs two available devices (cpu plus an OpenCL or CUDA device)")
    a = fg.ones(3, device=devices[0])
    b = fg.ones(3, device=devices[1])
    for fn in (lambda: a + b, lambda: a * b, lambda: fg.where(a > 0, a, b), lambda: fg.cat([a, b]),
               lambda: a.reshape(3, 1) @ b.reshape(1, 3), lambda: fg.maximum(a, b)):
        with pytest.raises(fg.BackendError, match=r"different devices|is on|on cpu"):
            fn()
    close((a.to(devices[1]) + b).to("cpu"), torch.full((3,), 2.0))


def test_repr(device):
    dev = "" if device == "cpu" else f", device='{fg.device(device)}'"
    assert repr(fg.tensor([1.0, 2.5], device=device)) == f"tensor([1. , 2.5]{dev})"
    assert repr(fg.tensor([1, 2], device=device)) == f"tensor([1, 2]{dev})"
    assert repr(fg.tensor(3.0, device=device)) == f"tensor(3.{dev})"
    assert repr(fg.tensor([True], device=device)) == f"tensor([ True]{dev})"
    if unsupported_dtype(device, "float16") is None:
        assert repr(fg.tensor([1.0], dtype=fg.float16, device=device)) == f"tensor([1.]{dev}, dtype=flowgraph.float16)"
    if unsupported_dtype(device, "bfloat16") is None:
        assert "dtype=flowgraph.bfloat16" in repr(fg.tensor([1.0], dtype=fg.bfloat16, device=device))
    assert "requires_grad=True" in repr(fg.zeros(2, requires_grad=True, device=device))
    assert "grad_fn=<MulBackward>" in repr(fg.zeros(2, requires_grad=True, device=device) * 2)
    assert "dtype=flowgraph.float32" in repr(fg.zeros(0, device=device))
    big = repr(fg.zeros(100, 100, device=device))
    assert "..." in big and len(big) < 2000


def test_hash_and_containers(device):
    a, b = fg.zeros(2, device=device), fg.zeros(2, device=device)
    assert len({a, b}) == 2
    assert {a: 1}[a] == 1


def test_pickles_for_inter_process_transfer(device):
    import pickle

    back = pickle.loads(pickle.dumps(fg.ones(2, device=device)))
    assert back.device == fg.device(device) and back.tolist() == [1.0, 1.0]
    with pytest.raises(fg.FlowError, match="non-leaf"):
        pickle.dumps(fg.ones(2, requires_grad=True, device=device) * 2)


def test_constructor(device):
    x = fg.Tensor([[1.0, 2.0]], device=device)
    assert x.shape == (1, 2) and x.device == fg.device(device)
    assert fg.Tensor().shape == (0,)


def test_import_is_light_and_fast():
    code = (
        "import sys, time, json; t0 = time.perf_counter(); import flowgraph; "
        "dt = time.perf_counter() - t0; "
        "print(json.dumps({'seconds': dt, 'modules': sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('cupy', 'pyopencl', 'starlette', 'graphviz', 'torch', 'uvicorn', 'sse_starlette'))}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"import flowgraph took {report['seconds'] * 1000:.0f} ms (target < 300 ms)")
    assert report["modules"] == [], f"import flowgraph pulled in {report['modules']}"
