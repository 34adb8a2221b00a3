"""examples/pytorch_ports: each flowgraph port is its PyTorch reference with renames only, and trains to the
same losses from the same initial weights (torch's, copied through ``load_state_dict``) and the same batches.

Dropout is 0 in the comparisons (the GPT's config, the CNN's two ``Dropout.p``), so the two runs are the
same computation; losses agree to rtol 1e-5 (float32, a few optimizer steps).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import flowgraph as fg

ROOT = pathlib.Path(__file__).resolve().parents[2]
PORTS = ROOT / "examples" / "pytorch_ports"

# The renames, as examples/pytorch_ports/README.md lists them: import lines, then `torch.` -> `fg.`.
IMPORT_RENAMES = {
    "import torch": "import flowgraph as fg",
    "import torch.nn as nn": "from flowgraph import nn",
    "from torch.nn import functional as F": "import flowgraph.nn.functional as F",
    "import torch.nn.functional as F": "import flowgraph.nn.functional as F",
    "import torch.optim as optim": "from flowgraph import optim",
    "from torch.optim.lr_scheduler import StepLR": "from flowgraph.optim.lr_scheduler import StepLR",
}
PAIRS = [("char_gpt", "train.py", "train_torch.py"), ("mnist_cnn", "main.py", "main_torch.py")]


def load(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"port_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parts(path: pathlib.Path) -> tuple[set[str], str]:
    """(the import lines, the code after them), the module docstring dropped."""
    text = path.read_text()
    assert text.startswith('"""'), path
    lines = text[text.index('"""', 3) + 3:].splitlines()
    i = 0
    while i < len(lines) and (not lines[i] or lines[i].startswith(("import ", "from ", "#"))):
        i += 1
    imports = {line for line in lines[:i] if line.startswith(("import ", "from "))}
    return imports, "\n".join(lines[i:])


def _expand(imports: set[str]) -> set[str]:
    """``from flowgraph import nn, optim`` -> one line per name, so combined imports compare equal."""
    out = set()
    for line in imports:
        m = re.fullmatch(r"from (\S+) import (.+)", line)
        if m and "," in m.group(2):
            out |= {f"from {m.group(1)} import {name.strip()}" for name in m.group(2).split(",")}
        else:
            out.add(line)
    return out


@pytest.mark.parametrize("folder, port, reference", PAIRS, ids=[p[0] for p in PAIRS])
def test_port_is_the_reference_with_renames_only(folder, port, reference):
    f_imports, f_code = _parts(PORTS / folder / port)
    t_imports, t_code = _parts(PORTS / folder / reference)
    assert "torch" not in f_code and "fg." in f_code
    assert f_code == re.sub(r"\btorch\.", "fg.", t_code)
    assert _expand(f_imports) == _expand({IMPORT_RENAMES.get(line, line) for line in t_imports})


def _copy_weights(f_model, t_model):
    state = {k: v.detach().numpy() for k, v in t_model.state_dict().items()}
    assert list(state) == list(f_model.state_dict())
    f_model.load_state_dict(state)


@pytest.mark.parametrize("flash", [True, False], ids=["sdpa", "masked-softmax"])
def test_char_gpt_port_trains_like_torch(device, flash):
    t, f = load(PORTS / "char_gpt" / "train_torch.py"), load(PORTS / "char_gpt" / "train.py")
    data, chars = t.encode_text(t.TEXT)
    torch.manual_seed(0)
    t_model = t.GPT(t.GPTConfig(vocab_size=len(chars), dropout=0.0, flash=flash))
    f_model = f.GPT(f.GPTConfig(vocab_size=len(chars), dropout=0.0, flash=flash))
    _copy_weights(f_model, t_model)
    assert f_model.transformer.wte.weight is f_model.lm_head.weight  # tied, as in torch
    assert f_model.get_num_params() == t_model.get_num_params()
    t_losses = t.train(t_model, data, steps=5, seed=3)
    f_losses = f.train(f_model, data, steps=5, seed=3, device=device)
    np.testing.assert_allclose(f_losses, t_losses, rtol=1e-5)
    assert t_losses[-1] < t_losses[0]
    context = [[chars.index("\n")]]
    t_text = t_model.eval().generate(torch.tensor(context), 6)[0].tolist()
    f_text = f_model.eval().generate(fg.tensor(context, device=device), 6)[0].tolist()
    assert f_text == t_text


def test_mnist_cnn_port_trains_like_torch(device):
    t, f = load(PORTS / "mnist_cnn" / "main_torch.py"), load(PORTS / "mnist_cnn" / "main.py")
    args = SimpleNamespace(log_interval=100, dry_run=False)
    torch.manual_seed(0)
    t_model, f_model = t.Net(), f.Net().to(device)
    _copy_weights(f_model, t_model)
    for model in (t_model, f_model):
        model.dropout1.p = model.dropout2.p = 0.0
    images, labels = t.synthetic_mnist(24, seed=1)  # 3 batches of 8 per epoch
    test_images, test_labels = t.synthetic_mnist(16, seed=2)
    results = {}
    for lib, model in (("torch", t_model), ("fg", f_model)):
        mod = t if lib == "torch" else f
        dev = "cpu" if lib == "torch" else device
        loader = mod.NumpyLoader(images, labels, batch_size=8, shuffle=True, seed=5)
        optimizer = mod.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
        scheduler = mod.StepLR(optimizer, step_size=1, gamma=0.7)
        losses = []
        for epoch in (1, 2):
            losses += mod.train(args, model, dev, loader, optimizer, epoch)
            scheduler.step()
        results[lib] = losses, mod.test(model, dev, mod.NumpyLoader(test_images, test_labels, batch_size=8))
    (t_losses, (t_test, t_correct)), (f_losses, (f_test, f_correct)) = results["torch"], results["fg"]
    assert len(t_losses) == 6
    np.testing.assert_allclose(f_losses, t_losses, rtol=1e-5)
    np.testing.assert_allclose(f_test, t_test, rtol=1e-5)
    assert f_correct == t_correct


@pytest.mark.parametrize("script", ["char_gpt/train.py", "mnist_cnn/main.py"])
def test_port_has_help_and_device_flag(script):
    out = subprocess.run([sys.executable, str(PORTS / script), "--help"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert "--device" in out.stdout
