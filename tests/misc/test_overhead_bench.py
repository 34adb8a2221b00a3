"""``benchmarks/overhead.py``: torch runs the chain on the device flowgraph is timed on (CUDA for ``--device
cuda``, the CPU otherwise), and a CUDA run without a CUDA torch stops with a message saying what to pass."""

import sys

import pytest

torch = pytest.importorskip("torch")

from benchmarks import overhead  # noqa: E402


def test_torch_runs_the_chain_on_the_flowgraph_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert overhead._torch_device("cuda") == "cuda"
    assert overhead._torch_device("cuda:1") == "cuda"
    assert overhead._torch_device("cpu") == "cpu"
    assert overhead._torch_device("opencl:0") == "cpu"  # torch has no OpenCL


def test_cuda_without_a_cuda_torch_says_what_to_pass(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--torch-device cpu"):
        overhead._torch_device("cuda")


def test_cpu_run_prints_both_frameworks(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--ops", "8", "--repeats", "1", "--threads", "1"])
    threads = torch.get_num_threads()
    try:
        overhead.main()
    finally:
        torch.set_num_threads(threads)  # the script sets torch's thread count for the whole process
    out = capsys.readouterr().out
    assert "flowgraph cpu      fwd+bwd" in out
    assert "torch cpu  fwd+bwd" in out
    assert "reference" not in out  # the CPU reference line is printed only when torch runs on CUDA
