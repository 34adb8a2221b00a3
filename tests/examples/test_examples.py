"""Every example runs (small epoch counts) and does what it says."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(rel: str):
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(path.parent.name + "_" + path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_transfer_learning_example(tmp_path):
    result = load("examples/transfer_learning/train.py").train(epochs=30, workdir=str(tmp_path), verbose=False)
    assert (tmp_path / "encoder_v1.safetensors").exists()
    assert result["final_loss"] < result["first_loss"]


def test_observation_example(tmp_path):
    result = load("examples/observation/train.py").train(epochs=40, out_dir=str(tmp_path), verbose=False)
    assert result["metrics"]["val_loss"] < result["first_val"]
    assert "<svg" in pathlib.Path(result["page"]).read_text()


@pytest.mark.parametrize("script", sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("examples/*/*.py")
                                          if p.name != "__init__.py"))
def test_every_example_has_a_help_and_device_flag(script):
    out = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--device" in out.stdout


def test_data_parallel_example_on_two_cpu_processes(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "flowgraph.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(port), str(ROOT / "examples/data_parallel/train.py"),
                          "--device", "cpu", "--epochs", "6", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("trained on 2 rank(s)")]
    assert len(lines) == 1, out.stdout  # rank 0 only
    first, last = (float(v) for v in lines[0].split("loss ")[1].split(";")[0].split(" -> "))
    assert last < 0.5 * first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["regressor.safetensors", "report.html"]


def test_showcase_writes_into_its_run_folder_without_graphviz(tmp_path):
    """No ``dot`` on the PATH: the diagram's DOT, the report and the CSV land in runs/showcase/, not the sources."""
    before = sorted(p.name for p in (ROOT / "examples" / "showcase").iterdir())
    env = {"PYTHONPATH": str(ROOT), "PATH": str(tmp_path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, str(ROOT / "examples/showcase/train.py"), "--epochs", "1"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    run = tmp_path / "runs" / "showcase"
    assert sorted(p.name for p in run.iterdir()) == ["report.csv", "report.html", "showcase.dot"]
    assert "digraph" in (run / "showcase.dot").read_text()
    assert sorted(p.name for p in (ROOT / "examples" / "showcase").iterdir()) == before
