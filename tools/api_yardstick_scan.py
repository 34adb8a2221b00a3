"""Rebuild ``tools/api_yardstick.txt``: the public torch names that the reference programs use.

Needs torch and local checkouts of the five programs (nothing is downloaded)::

    git clone https://github.com/karpathy/nanoGPT CLONES/nanoGPT        # and minGPT, makemore,
    git clone https://github.com/pytorch/examples CLONES/examples        # pytorch-image-models
    python tools/api_yardstick_scan.py CLONES > tools/api_yardstick.txt

Each listed file is parsed (``ast``, nothing is executed). Attribute chains and names that start at an alias
of a torch import (``import torch.nn as nn``, ``from torch.nn import functional as F``, ``from torch.utils.data
import DataLoader``) are resolved to qualified names and kept when torch has them (modules themselves and
private names are dropped; ``torch.nn.modules.x.Y`` becomes ``torch.nn.Y`` when that is the same object).
Any other ``.attr`` whose name is an attribute of ``torch.Tensor``, ``torch.nn.Module`` or
``torch.optim.Optimizer`` counts as that class's attribute: the scan cannot know the receiver's type, so
``DROP`` removes the false positives found by reading the sources (``str.split``, ``set.add``, ``re.compile``
...) and ``ADD`` puts back what the scan cannot see (``self.training``). The output is the committed file.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import pathlib
import sys
import types

# program -> (folder under CLONES, files read, description in the output)
SOURCES: dict[str, tuple[str, list[str], str]] = {
    "nanoGPT": ("nanoGPT", ["model.py", "train.py", "sample.py", "bench.py"],
                "karpathy/nanoGPT: model.py, train.py, sample.py, bench.py"),
    "minGPT": ("minGPT", ["mingpt/model.py", "mingpt/trainer.py", "mingpt/utils.py", "mingpt/bpe.py",
                          "projects/adder/adder.py", "projects/chargpt/chargpt.py"],
               "karpathy/minGPT: mingpt/model.py, trainer.py, utils.py, bpe.py, projects/adder, projects/chargpt"),
    "makemore": ("makemore", ["makemore.py"], "karpathy/makemore: makemore.py"),
    "pytorch/examples": ("examples", [
        "dcgan/main.py", "imagenet/main.py", "language_translation/main.py", "language_translation/src/model.py",
        "language_translation/src/data.py", "mnist/main.py", "mnist_forward_forward/main.py",
        "mnist_hogwild/main.py", "mnist_hogwild/train.py", "mnist_rnn/main.py", "regression/main.py",
        "reinforcement_learning/actor_critic.py", "reinforcement_learning/reinforce.py", "siamese_network/main.py",
        "super_resolution/main.py", "super_resolution/model.py", "super_resolution/data.py",
        "super_resolution/dataset.py", "super_resolution/super_resolve.py", "time_sequence_prediction/train.py",
        "time_sequence_prediction/generate_sine_wave.py", "vae/main.py", "word_language_model/main.py",
        "word_language_model/model.py", "word_language_model/data.py", "word_language_model/generate.py",
        "fast_neural_style/neural_style/neural_style.py", "fast_neural_style/neural_style/transformer_net.py",
        "fast_neural_style/neural_style/utils.py", "fast_neural_style/neural_style/vgg.py", "gat/main.py",
        "gcn/main.py", "distributed/ddp/example.py", "distributed/ddp-tutorial-series/multigpu.py",
        "distributed/ddp-tutorial-series/single_gpu.py", "distributed/ddp-tutorial-series/datautils.py",
        "distributed/minGPT-ddp/mingpt/model.py", "distributed/minGPT-ddp/mingpt/trainer.py",
        "distributed/minGPT-ddp/mingpt/char_dataset.py", "distributed/minGPT-ddp/mingpt/main.py"],
        "pytorch/examples: dcgan, imagenet, language_translation, mnist, mnist_forward_forward, mnist_hogwild, "
        "mnist_rnn, regression, reinforcement_learning, siamese_network, super_resolution, "
        "time_sequence_prediction, vae, word_language_model, fast_neural_style, gat, gcn, distributed/ddp, "
        "distributed/ddp-tutorial-series, distributed/minGPT-ddp"),
    "timm": ("pytorch-image-models", [
        "timm/models/resnet.py", "timm/models/vision_transformer.py", "timm/models/convnext.py",
        "timm/models/mlp_mixer.py", "timm/models/efficientnet.py", "timm/layers/mlp.py", "timm/layers/drop.py",
        "timm/layers/patch_embed.py", "timm/layers/attention.py", "timm/layers/norm.py",
        "timm/layers/classifier.py", "timm/layers/adaptive_avgmax_pool.py", "timm/layers/weight_init.py",
        "timm/layers/pos_embed.py", "timm/layers/helpers.py", "timm/layers/activations.py",
        "timm/layers/layer_scale.py", "timm/layers/squeeze_excite.py", "timm/layers/padding.py",
        "timm/layers/conv2d_same.py", "timm/layers/std_conv.py", "timm/layers/norm_act.py"],
        "huggingface/pytorch-image-models (timm): models/resnet.py, vision_transformer.py, convnext.py, "
        "mlp_mixer.py, efficientnet.py and the layers they use (timm/layers: mlp, drop, patch_embed, attention, "
        "norm, classifier, adaptive_avgmax_pool, weight_init, pos_embed, helpers, activations, layer_scale, "
        "squeeze_excite, padding, conv2d_same, std_conv, norm_act)"),
}
# false positives of the untyped attribute scan, found by reading the sources
DROP = {
    "nanoGPT": set(),
    "minGPT": {"torch.Tensor.index", "torch.Tensor.add", "torch.nn.Module.compile"},  # list.index, set.add, re
    "makemore": {"torch.Tensor.index", "torch.Tensor.type", "torch.nn.Module.type"},
    "pytorch/examples": {"torch.Tensor.name", "torch.Tensor.resize", "torch.Tensor.type", "torch.nn.Module.type",
                         "torch.nn.modules.linear.NonDynamicallyQuantizableLinear"},  # onnx .name, PIL resize
    "timm": {"torch.Tensor.values", "torch.nn.Module.compile", "torch.Tensor.type", "torch.nn.Module.type"},
}
# attributes the scan cannot see (instance attributes set in __init__), read in the sources
ADD = {"nanoGPT": {"torch.nn.Module.training"}, "minGPT": {"torch.nn.Module.training"}, "makemore": set(),
       "pytorch/examples": {"torch.nn.Module.training"}, "timm": {"torch.nn.Module.training"}}
HEADER = """\
# The yardstick for tools/api_coverage.py: the public torch names used by the programs the migration
# guide's readers port. One qualified torch name per line, grouped by program (a name used by several
# programs is listed under each). Collected by parsing each listed file's AST (aliases of torch
# imports resolved; methods and attributes of tensors, modules and optimizers taken where the
# attribute name is one of torch.Tensor's, torch.nn.Module's or torch.optim.Optimizer's), then read
# by hand: scan false positives (str.split, set.add, dict.values ...) and private names removed,
# attributes the scan cannot type (module.training) added. Rebuilt by tools/api_yardstick_scan.py from
# checkouts of nanoGPT 3adf61e, minGPT 37baab7, makemore 988aa59, pytorch/examples 77f55b9 and
# pytorch-image-models aa4b585.
"""


def resolve(qualified: str) -> object | None:
    """The torch object a qualified name denotes, importing submodules as needed; None if there is none."""
    parts = qualified.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except Exception:  # noqa: BLE001 - not a module either
            return None
    return obj


def public_name(qualified: str) -> str:
    """``torch.nn.modules.linear.Linear`` -> ``torch.nn.Linear`` (likewise under ``torch.utils.data``)."""
    name = qualified.rsplit(".", 1)[-1]
    for package in ("torch.nn", "torch.utils.data"):
        if qualified.startswith(package + ".") and qualified.count(".") > package.count(".") + 1:
            if getattr(resolve(package), name, None) is resolve(qualified):
                return f"{package}.{name}"
    return qualified


def _chain(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def scan(source: str, class_attrs: dict[str, set[str]]) -> set[str]:
    """Qualified torch names in one file (see the module docstring)."""
    tree = ast.parse(source)
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    alias[a.asname or "torch"] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
    found: set[str] = set()
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            value = node.value
            while isinstance(value, ast.Attribute):  # only the outermost node of a chain is looked at
                inner.add(id(value))
                value = value.value
            chain = _chain(node)
            if chain and chain[0] in alias:
                parts = (alias[chain[0]] + "." + ".".join(chain[1:])).split(".")
                while parts and resolve(".".join(parts)) is None:  # drop attributes of the result
                    parts.pop()
                if len(parts) > 1:
                    found.add(".".join(parts))
            else:
                found |= {f"{cls}.{node.attr}" for cls, attrs in class_attrs.items() if node.attr in attrs}
        elif isinstance(node, ast.Name) and node.id in alias and isinstance(node.ctx, ast.Load):
            if resolve(alias[node.id]) is not None:
                found.add(alias[node.id])
    return found


def main(argv: list[str] | None = None) -> int:
    """Print the yardstick built from the checkouts under ``clones``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clones", type=pathlib.Path, help="folder holding nanoGPT/, minGPT/, makemore/, "
                        "examples/ (pytorch/examples) and pytorch-image-models/")
    args = parser.parse_args(argv)
    import torch  # a dependency of this tool only, never of flowgraph

    class_attrs = {cls: {a for a in dir(resolve(cls)) if not a.startswith("_")}
                   for cls in ("torch.Tensor", "torch.nn.Module", "torch.optim.Optimizer")}
    class_attrs["torch.optim.Optimizer"] |= {"param_groups", "state"}  # set in __init__
    del torch
    out = [HEADER]
    for program, (folder, files, description) in SOURCES.items():
        names: set[str] = set()
        for rel in files:
            names |= scan((args.clones / folder / rel).read_text(), class_attrs)
        kept = set()
        for name in names - DROP[program]:
            if isinstance(resolve(name), types.ModuleType):
                continue
            name = public_name(name)
            if not any(part.startswith("_") for part in name.split(".")):
                kept.add(name)
        kept |= ADD[program]
        out += [f"# == {program} ({len(kept)} names)", f"# {description}", *sorted(kept), ""]
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
