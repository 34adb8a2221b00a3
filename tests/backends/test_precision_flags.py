"""PyTorch's precision flags: names and defaults as torch's, the TF32 switch reaching cuBLAS (checked with a recording
stand-in for libcublas here, and for real on a GPU), fg.cuda device selection and fg.accelerator."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg
from flowgraph.backends import available_devices, registry
from flowgraph.backends.cuda import blas
from flowgraph.errors import BackendError, FlowError

HAS_CUDA = any(d.startswith("cuda") for d in available_devices())
gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device available here")


@pytest.fixture(autouse=True)
def _restore_flags():
    saved = fg.get_float32_matmul_precision(), dict(fg.backends.cudnn.__dict__)
    yield
    fg.set_float32_matmul_precision(saved[0])
    fg.backends.cudnn.__dict__.update(saved[1])


def test_defaults_and_mapping_match_torch():
    torch = pytest.importorskip("torch")
    t_saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        assert fg.backends.cuda.matmul.allow_tf32 is torch.backends.cuda.matmul.allow_tf32 is False
        assert fg.get_float32_matmul_precision() == torch.get_float32_matmul_precision() == "highest"
        fresh = type(fg.backends.cudnn)()  # the defaults (the suite runs with cudnn.allow_tf32 off: conftest)
        for name in ("allow_tf32", "benchmark", "deterministic", "enabled"):
            assert getattr(fresh, name) == getattr(torch.backends.cudnn, name), name
        for precision in ("high", "medium", "highest"):
            fg.set_float32_matmul_precision(precision)
            torch.set_float32_matmul_precision(precision)
            assert fg.backends.cuda.matmul.allow_tf32 == torch.backends.cuda.matmul.allow_tf32, precision
        for allowed in (True, False):
            fg.backends.cuda.matmul.allow_tf32 = allowed
            torch.backends.cuda.matmul.allow_tf32 = allowed
            assert fg.get_float32_matmul_precision() == torch.get_float32_matmul_precision(), allowed
    finally:
        torch.set_float32_matmul_precision(t_saved[0])
        torch.backends.cudnn.allow_tf32 = t_saved[1]


def test_flags_are_settable_like_torch_and_checked():
    fg.backends.cudnn.benchmark = True
    fg.backends.cudnn.deterministic = True
    fg.backends.cudnn.allow_tf32 = False
    assert fg.backends.cudnn.benchmark and fg.backends.cudnn.deterministic and not fg.backends.cudnn.allow_tf32
    assert fg.backends.cudnn.is_available() is (fg.backends.cudnn.unavailable_reason() is None)
    assert "benchmark=True" in repr(fg.backends.cudnn) and "allow_tf32=False" in repr(fg.backends.cuda.matmul)
    with pytest.raises(FlowError, match="must be True or False"):
        fg.backends.cuda.matmul.allow_tf32 = "yes"
    with pytest.raises(FlowError, match="must be True or False"):
        fg.backends.cudnn.benchmark = 1
    with pytest.raises(FlowError, match="no setting 'allow_tf33'"):
        fg.backends.cudnn.allow_tf33 = True
    with pytest.raises(FlowError, match="no setting 'allow_fp16'"):
        fg.backends.cuda.matmul.allow_fp16 = True
    with pytest.raises(FlowError, match=r"one of \['highest', 'high', 'medium'\]"):
        fg.set_float32_matmul_precision("low")


class _RecordingCublas:
    """Stands in for libcublas: records which GEMM entry point and compute type each call used."""

    def __init__(self):
        self.calls = []

    def cublasSgemmStridedBatched(self, *args):
        self.calls.append(("Sgemm", None))
        return 0

    def cublasDgemmStridedBatched(self, *args):
        self.calls.append(("Dgemm", None))
        return 0

    def cublasGemmStridedBatchedEx(self, *args):
        self.calls.append(("GemmEx", args[-2]))  # (..., computeType, algo)
        return 0


def _handle(lib):
    h = object.__new__(blas.Cublas)
    h.lib = lib
    h.handle = None
    h._bind_stream = lambda: None
    h._one = {blas.F32: 1.0, blas.F64: 1.0}
    h._zero = {blas.F32: 0.0, blas.F64: 0.0}
    return h


def test_allow_tf32_selects_the_cublas_compute_type_at_each_call(monkeypatch):
    monkeypatch.setattr(blas.ctypes, "byref", lambda x: x)
    lib = _RecordingCublas()
    h = _handle(lib)
    operand = (0, 4, False, 0)

    def gemm(dtype):
        h.gemm(dtype, 4, 4, 4, operand, operand, 0, 1)
        return lib.calls[-1]

    assert gemm(blas.F32) == ("Sgemm", None)  # default: exact float32
    fg.backends.cuda.matmul.allow_tf32 = True
    assert gemm(blas.F32) == ("GemmEx", blas._COMPUTE_32F_FAST_TF32)
    assert gemm(blas.F64) == ("Dgemm", None)  # TF32 never touches float64 ...
    assert gemm(blas.F16) == ("GemmEx", blas._COMPUTE_32F)  # ... nor half precision
    fg.set_float32_matmul_precision("highest")
    assert gemm(blas.F32) == ("Sgemm", None)
    fg.set_float32_matmul_precision("medium")
    assert blas.compute_type(blas.F32) == 77 and blas.compute_type(blas.BF16) == 68


@gpu
def test_tf32_matmul_on_cuda_is_rounded_only_when_allowed():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    x, y = fg.tensor(a, device="cuda"), fg.tensor(b, device="cuda")

    def rel_error():
        return float(np.abs((x @ y).numpy() - exact).max() / np.abs(exact).max())

    fg.backends.cuda.matmul.allow_tf32 = False
    strict = rel_error()
    fg.backends.cuda.matmul.allow_tf32 = True
    relaxed = rel_error()
    assert strict < 1e-5
    if fg.cuda.get_device_capability() >= (8, 0):  # TF32 tensor cores exist from Ampere on
        assert 1e-5 < relaxed < 1e-2


def test_bare_cuda_means_the_device_set_device_chose():
    assert registry.parse_device("cuda") == "cuda:0"
    try:
        registry.set_default_index("cuda", 1)
        assert registry.parse_device("cuda") == "cuda:1" == fg.device("cuda")
        assert registry.parse_device("cuda:0") == "cuda:0"
        assert registry.parse_device("opencl") == "opencl:0"
    finally:
        registry.set_default_index("cuda", 0)
    assert registry.parse_device("cuda") == "cuda:0"


def test_fg_cuda_queries_and_accelerator():
    if HAS_CUDA:
        index = fg.cuda.current_device()
        assert fg.accelerator.is_available() and fg.accelerator.current_accelerator() == f"cuda:{index}"
        assert fg.cuda.is_bf16_supported() is True
        assert fg.cuda.is_bf16_supported(including_emulation=False) == (fg.cuda.get_device_capability() >= (8, 0))
        fg.cuda.set_device(fg.cuda.device_count() - 1)
        try:
            assert fg.device("cuda") == f"cuda:{fg.cuda.device_count() - 1}"
            assert fg.zeros(2, device="cuda").device == fg.device("cuda")
            assert fg.ones(2).cuda().device == fg.device("cuda")  # x.cuda() means the current device, as torch
            assert fg.nn.Linear(2, 2).cuda().weight.device == fg.device("cuda")
        finally:
            fg.cuda.set_device(0)
        with pytest.raises(BackendError, match="does not exist"):
            fg.cuda.set_device(fg.cuda.device_count())
        return
    assert fg.cuda.is_bf16_supported() is False and fg.cuda.is_bf16_supported(False) is False
    assert fg.accelerator.is_available() is False and fg.accelerator.current_accelerator() is None
    assert fg.accelerator.device_count() == 0
    for call in (lambda: fg.cuda.set_device(0), fg.cuda.current_device, fg.accelerator.current_device_index):
        with pytest.raises(BackendError, match="no CUDA device is available"):
            call()
    with pytest.raises(BackendError, match="not a CUDA device"):
        fg.cuda.set_device("cpu")
