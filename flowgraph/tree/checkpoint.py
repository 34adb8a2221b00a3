"""Checkpoints in safetensors: atomic save, strict/partial load, subgraph load, optimizer state, migration.

File layout: one safetensors file. Tensor entries are the module's ``state_dict()`` keys (host copies;
bfloat16 stored as its raw uint16 bits) plus optimizer tensors under ``@optimizer/state/<i>/<name>``.
The header's metadata holds:

* ``format`` = ``"flowgraph.checkpoint"``, ``format_version`` = ``"1"``;
* ``structural_hash``: computed from the graph's structure (verbs, names, module classes, parameter shapes),
  never from counters, so an untagged module inserted elsewhere does not change a tagged subgraph's hash;
* ``label``; ``dtypes`` (JSON: key -> dtype name); ``classes`` (JSON: module path -> class name), used by
  ``migrate_checkpoint``; ``optimizer`` (JSON: the optimizer's non-tensor state and param groups);
* ``user_metadata`` (only when ``save_checkpoint(..., metadata=...)`` was given): the caller's JSON-able values,
  written by ``flowgraph.serialization.encode_metadata`` (tuples, int keys, ``inf``/``nan`` come back as saved)
  and returned as ``LoadReport.metadata``.

Nothing here unpickles: safetensors stores raw bytes and JSON only.
"""

from __future__ import annotations

import json
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..nn import Module
from ..serialization import (
    atomic_write,
    checksum,
    decode_metadata,
    encode_metadata,
    from_host,
    read_safetensors,
    to_host,
    verify_checksums,
)
from ..tensor import Tensor, tensor

FORMAT = "flowgraph.checkpoint"
FORMAT_VERSION = "1"
_OPT_PREFIX = "@optimizer/state/"


@dataclass
class LoadReport:
    """What ``load_checkpoint`` did: keys ``loaded``, ``skipped`` (in the file, not used) and ``missing``
    (in the model, not in the file), and the ``metadata`` given to ``save_checkpoint`` (``{}`` if none)."""

    loaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"loaded {len(self.loaded)}, skipped {len(self.skipped)}, missing {len(self.missing)}"


@dataclass
class MigrateReport:
    """What ``migrate_checkpoint`` did: ``unchanged`` keys, ``remapped`` (old -> new), ``dropped`` old keys
    with no place in the new model, and ``missing`` new keys the old file could not fill."""

    unchanged: list[str] = field(default_factory=list)
    remapped: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _structure_of(module: Module) -> tuple[str, str, dict[str, str]]:
    """(structural hash, label, classes) for a Graph or any module."""
    hash_fn = getattr(module, "structural_hash", None)
    if callable(hash_fn):
        digest = hash_fn()
    else:
        import hashlib

        parts = [f"{name}:{type(m).__name__}" for name, m in module.named_modules()]
        parts += [f"{k}:{tuple(v.shape)}" for k, v in module.state_dict().items()]
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    label = getattr(module, "label", None) or ""
    classes = {name: type(m).__name__ for name, m in module.named_modules()}
    return digest, label, classes


# ---------------------------------------------------------------------- paths
def _path(path: Any, where: str) -> str:
    """``path`` as a string; a CheckpointError naming it when it is not a str or ``os.PathLike``."""
    if not isinstance(path, (str, os.PathLike)) or not path:
        raise CheckpointError(f"{where}: path must be a non-empty str or os.PathLike (e.g. 'model.safetensors'), "
                              f"got {type(path).__name__} {path!r}")
    return os.fspath(path)


def _is_main_process() -> bool:
    """Rank 0 or no process group. The tree sits below ``flowgraph.distributed``: a process group exists only if
    that package was imported (``distributed.init``), so it is looked up, not imported."""
    dist = sys.modules.get("flowgraph.distributed")
    return dist is None or dist.is_main_process()


def save_checkpoint(module: Module, path: str | os.PathLike, optimizer: Any = None,
                    metadata: dict[str, Any] | None = None) -> None:
    """Save ``module``'s parameters and buffers (and ``optimizer``'s state) to a safetensors file, atomically.

    ``metadata``: a dict of JSON-able values (numbers, strings, None, bools and dicts/lists/tuples of them; e.g.
    ``{"epoch": 7, "config": {...}}``) stored in the header and returned by ``load_checkpoint`` as
    ``report.metadata`` (or read alone with :func:`checkpoint_metadata`). Anything else raises a
    ``CheckpointError`` naming its place, before anything is written.

    Inside a ``flowgraph.distributed`` process group only rank 0 writes (the others return at once: their
    replicas are identical), so a training script saves unchanged on every rank; call
    ``distributed.barrier()`` before other ranks read the file.
    """
    from safetensors.numpy import save

    path = _path(path, "save_checkpoint")
    if metadata is not None and not isinstance(metadata, dict):
        raise CheckpointError(f"save_checkpoint: metadata must be a dict, got {type(metadata).__name__}")
    user_metadata = None if metadata is None else encode_metadata(metadata, "save_checkpoint metadata")
    if not _is_main_process():
        return

    tensors: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for key, value in module.state_dict().items():
        arr, name = to_host(value)
        tensors[key] = arr
        dtypes[key] = name
    digest, label, classes = _structure_of(module)
    header = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "structural_hash": digest, "label": label,
        "dtypes": json.dumps(dtypes), "classes": json.dumps(classes),
    }
    if user_metadata is not None:
        header["user_metadata"] = user_metadata
    if optimizer is not None:
        opt_state = optimizer.state_dict()
        plain_state: dict[str, dict[str, Any]] = {}
        for idx, entries in opt_state.get("state", {}).items():
            plain_state[str(idx)] = {}
            for name, value in entries.items():
                if isinstance(value, Tensor):
                    key = f"{_OPT_PREFIX}{idx}/{name}"
                    arr, dname = to_host(value)
                    tensors[key] = arr
                    dtypes[key] = dname
                    plain_state[str(idx)][name] = {"tensor": key}
                else:
                    try:
                        json.dumps(value)
                    except (TypeError, ValueError):
                        raise CheckpointError(
                            f"save_checkpoint: optimizer state {name!r} of parameter #{idx} is a "
                            f"{type(value).__name__} ({type(optimizer).__name__} keeps more than tensors and "
                            "numbers); checkpoints store tensors and JSON values: save the whole training state "
                            "with fg.save({'model': model.state_dict(), 'optimizer': opt.state_dict()}, path)"
                        ) from None
                    plain_state[str(idx)][name] = {"value": value}
        header["optimizer"] = json.dumps({"state": plain_state, "param_groups": opt_state.get("param_groups", [])})
        header["dtypes"] = json.dumps(dtypes)
    header["checksums"] = json.dumps({k: checksum(v) for k, v in tensors.items()})
    try:
        data = save(tensors, metadata=header)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types
        raise CheckpointError(f"cannot serialise checkpoint for {path!r}: {exc}") from exc
    atomic_write(path, data)


# ---------------------------------------------------------------------- reading
def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a checkpoint file: ``(tensors by key, metadata)``; CheckpointError for anything malformed."""
    path = _path(path, "load_checkpoint")
    raw, metadata = read_safetensors(path)
    if metadata.get("format") != FORMAT:
        raise CheckpointError(
            f"{path!r} is a safetensors file but not a flowgraph checkpoint (format={metadata.get('format')!r}); "
            "to load plain weights (e.g. a PyTorch state_dict) use flowgraph.tree.load_safetensors_weights"
        )
    if metadata.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path!r} has format version {metadata.get('format_version')!r}; this flowgraph reads "
            f"version {FORMAT_VERSION}"
        )
    dtypes = _json_mapping(metadata, "dtypes", path)
    checksums = _json_mapping(metadata, "checksums", path) if "checksums" in metadata else None
    if checksums is not None:  # files written before checksums existed load unverified
        verify_checksums(raw, checksums, path)
    tensors = {k: from_host(v, str(dtypes.get(k, v.dtype)), k, path) for k, v in raw.items()}
    return tensors, metadata


def _user_metadata(metadata: dict[str, str], path: str | os.PathLike) -> dict[str, Any]:
    """The ``metadata=`` dict given to ``save_checkpoint`` (``{}`` for files saved without one)."""
    if "user_metadata" not in metadata:
        return {}
    value = decode_metadata(metadata["user_metadata"], os.fspath(path))
    if not isinstance(value, dict):
        raise CheckpointError(f"checkpoint {os.fspath(path)!r} has corrupt 'user_metadata': not a dict")
    return value


def checkpoint_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The ``metadata=`` dict a checkpoint was saved with (``{}`` if none), without loading it into a model;
    e.g. to read the epoch or the config before building the model."""
    _, metadata = read_checkpoint(path)
    return _user_metadata(metadata, path)


def _kind(dtype: np.dtype) -> str:
    """"f" for floating dtypes (bfloat16 included), else NumPy's kind ("b", "i", "u")."""
    return "f" if dtype.kind == "f" or dtype.name == "bfloat16" else ("i" if dtype.kind == "u" else dtype.kind)


def _differing(a: str, b: str) -> str:
    """Two hashes shown with just enough digits to tell them apart (at least 12)."""
    n = 12
    while n < max(len(a), len(b)) and a[:n] == b[:n]:
        n += 8
    return f"{a[:n]} vs this model's {b[:n]}"


def _json_mapping(metadata: dict, name: str, path: str) -> dict:
    """``metadata[name]`` parsed as a JSON object of strings; CheckpointError when it is anything else."""
    try:
        value = json.loads(metadata.get(name, "{}"))
    except (TypeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path!r} has corrupt {name!r} metadata: {exc}") from exc
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise CheckpointError(f"checkpoint {path!r} has corrupt {name!r} metadata: expected an object of strings")
    return value


def load_checkpoint(module: Module, path: str | os.PathLike, strict: bool = True, optimizer: Any = None,
                    check_structure: bool = True) -> LoadReport:
    """Load a checkpoint into ``module``.

    ``strict`` (default): the structural hash, the key set and every shape must match, else
    ``fg.CheckpointError`` naming the key (and both shapes). ``strict=False`` loads what matches and
    reports the rest. Nothing in the model changes unless the whole load is valid. The report's ``metadata``
    is the dict given to ``save_checkpoint(..., metadata=)``.
    """
    tensors, metadata = read_checkpoint(path)
    digest, _, _ = _structure_of(module)
    if strict and check_structure and metadata.get("structural_hash") != digest:
        raise CheckpointError(
            f"checkpoint {os.fspath(path)!r} was saved from a different structure (hash "
            f"{_differing(str(metadata.get('structural_hash', '?')), digest)}); use strict=False for a "
            "partial load or fg.migrate_checkpoint to map it onto the new structure"
        )
    own = module.state_dict(keep_vars=True)
    report = LoadReport(metadata=_user_metadata(metadata, path))
    # The model's order first (errors name the first mismatch in execution order), then extra file keys.
    file_keys = [k for k in tensors if not k.startswith("@optimizer/")]
    model_keys = [k for k in own if k in tensors] + [k for k in file_keys if k not in own]
    plan: list[tuple[str, np.ndarray, Tensor]] = []
    for key in model_keys:
        arr = tensors[key]
        target = own.get(key)
        if target is None:
            if strict:
                raise CheckpointError(
                    f"checkpoint key {key!r} has no place in the model; use strict=False to skip it"
                )
            report.skipped.append(key)
            continue
        if tuple(arr.shape) != tuple(target.shape):
            if strict:
                raise CheckpointError(
                    f"checkpoint key {key!r} has shape {tuple(arr.shape)} but the model's is {tuple(target.shape)}"
                )
            report.skipped.append(key)
            continue
        if _kind(arr.dtype) != _kind(target._data.dtype):
            raise CheckpointError(  # BOOL or I64 data for a float parameter would be cast into garbage silently
                f"checkpoint key {key!r} holds {arr.dtype} data but the model's tensor is {target.dtype}; the file "
                "does not belong to this model (or is corrupt)"
            )
        plan.append((key, arr, target))
    report.missing = [k for k in own if k not in tensors]
    if strict and report.missing:
        raise CheckpointError(
            f"checkpoint {os.fspath(path)!r} lacks {len(report.missing)} model keys, e.g. {report.missing[:3]}; "
            "use strict=False to load the rest"
        )
    opt_state = None
    if optimizer is not None:
        opt_state = _optimizer_state(tensors, metadata, path)
    from ..autograd.grad_mode import no_grad

    with no_grad():
        for key, arr, target in plan:
            value = tensor(arr, device=target.device).to(target.dtype)
            target._data = target._backend.assign(target._data, value._data)
            target._bump_version()
            report.loaded.append(key)
    if opt_state is not None:
        _load_optimizer(optimizer, opt_state)
    return report


def _optimizer_state(tensors: dict[str, np.ndarray], metadata: dict[str, str], path) -> dict:
    if "optimizer" not in metadata:
        raise CheckpointError(f"checkpoint {os.fspath(path)!r} holds no optimizer state (saved without optimizer=)")
    try:
        saved = json.loads(metadata["optimizer"])
        state: dict[int, dict[str, Any]] = {}
        for idx, entries in saved["state"].items():
            state[int(idx)] = {}
            for name, entry in entries.items():
                if "tensor" in entry:
                    if entry["tensor"] not in tensors:
                        raise CheckpointError(
                            f"checkpoint optimizer entry {entry['tensor']!r} is missing from the file")
                    state[int(idx)][name] = tensor(tensors[entry["tensor"]])
                else:
                    state[int(idx)][name] = entry["value"]
        groups = saved["param_groups"]
        if not isinstance(groups, list):
            raise TypeError("param_groups is not a list")
    except CheckpointError:
        raise
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint {os.fspath(path)!r} has corrupt optimizer metadata: {exc!r}") from exc
    return {"state": state, "param_groups": groups}


def _load_optimizer(optimizer: Any, state: dict) -> None:
    groups = optimizer.param_groups
    devices = {}
    index = 0
    for g in groups:
        for p in g["params"]:
            devices[index] = p
            index += 1
    for idx, entries in state["state"].items():
        p = devices.get(idx)
        if p is None:
            raise CheckpointError(f"optimizer state for parameter #{idx}, but the optimizer has {index} parameters")
        for name, value in entries.items():
            if isinstance(value, Tensor):
                if value.ndim and tuple(value.shape) != tuple(p.shape):  # exp_avg & co. are shaped like p
                    raise CheckpointError(
                        f"optimizer state {name!r} of parameter #{idx} has shape {tuple(value.shape)}, the parameter "
                        f"{tuple(p.shape)}: the file does not belong to this model's optimizer"
                    )
                entries[name] = value.to(p.device)
    optimizer.load_state_dict(state)


def load_subgraph_checkpoint(root: Module, path_in_tree: str, file: str | os.PathLike, strict: bool = True
                             ) -> LoadReport:
    """Load a checkpoint saved from a subgraph alone into the subgraph at ``path_in_tree``."""
    from .paths import subgraph_at

    return load_checkpoint(subgraph_at(root, path_in_tree), file, strict=strict)


# ---------------------------------------------------------------------- migration
def _groups(keys: list[str], shapes: dict[str, tuple], classes: dict[str, str]) -> OrderedDict:
    """Group keys by structural role: (stable path part, owning module class, parameter name, shape).

    The stable path part drops automatically numbered node names (``through_3``) but keeps tags and labels,
    so keys of a tower of identical untagged layers land in one group in execution order.
    """
    import re

    auto = re.compile(r"^[a-z]+(_\d+)+(_[a-z]+(_\d+)?)?$")
    groups: OrderedDict = OrderedDict()
    for key in keys:
        module_path, _, leaf = key.rpartition(".")
        parts = module_path.split(".") if module_path else []
        stable = ".".join(p if not auto.match(p) and not p.isdigit() else "#" for p in parts)
        role = (stable, classes.get(module_path, "?"), leaf, shapes[key])
        groups.setdefault(role, []).append(key)
    return groups


def migrate_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, model: Module) -> MigrateReport:
    """Rewrite an old checkpoint for ``model``'s current structure and save it to ``dst``.

    Keys present in both with the same shape are kept. Others are matched by structural role (stable
    path of tags/labels, module class, parameter name and shape) and, within a role, by position in
    execution order, so a tower of identical layers keeps each layer's weights in place. Keys are
    never matched by shape alone.
    """
    tensors, metadata = read_checkpoint(src)
    old_classes = json.loads(metadata.get("classes", "{}"))
    old_keys = [k for k in tensors if not k.startswith("@optimizer/")]
    own = model.state_dict()
    new_classes = {name: type(m).__name__ for name, m in model.named_modules()}
    new_shapes = {k: tuple(v.shape) for k, v in own.items()}
    old_shapes = {k: tuple(tensors[k].shape) for k in old_keys}
    report = MigrateReport()
    out: dict[str, np.ndarray] = {}
    unmatched_old = []
    for k in old_keys:
        if k in new_shapes and new_shapes[k] == old_shapes[k] and old_classes.get(k.rpartition(".")[0]) == \
                new_classes.get(k.rpartition(".")[0], old_classes.get(k.rpartition(".")[0])):
            out[k] = tensors[k]
            report.unchanged.append(k)
        else:
            unmatched_old.append(k)
    unmatched_new = [k for k in own if k not in out]
    old_groups = _groups(unmatched_old, old_shapes, old_classes)
    new_groups = _groups(unmatched_new, new_shapes, new_classes)
    for role, new_keys in new_groups.items():
        olds = old_groups.get(role, [])
        for nk, ok in zip(new_keys, olds):
            out[nk] = tensors[ok]
            report.remapped[ok] = nk
    report.dropped = [k for k in unmatched_old if k not in report.remapped]
    report.missing = [k for k in own if k not in out]
    from safetensors.numpy import save

    digest, label, classes = _structure_of(model)
    dtypes = json.loads(metadata.get("dtypes", "{}"))
    new_dtypes = {}
    stored = {}
    for k, arr in out.items():
        old_key = next((o for o, n in report.remapped.items() if n == k), k)
        name = dtypes.get(old_key, str(arr.dtype))
        new_dtypes[k] = name
        stored[k] = arr.view(np.uint16) if name == "bfloat16" else arr
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "structural_hash": digest, "label": label,
            "dtypes": json.dumps(new_dtypes), "classes": json.dumps(classes)}
    if "user_metadata" in metadata:
        meta["user_metadata"] = metadata["user_metadata"]
    atomic_write(dst, save({k: np.array(v, order="C") for k, v in stored.items()}, metadata=meta))
    return report


# ---------------------------------------------------------------------- foreign weights
def load_safetensors_weights(module: Module, path: str | os.PathLike, key_map: Any = None,
                             strict: bool = True):
    """Load a plain safetensors state dict (e.g. ``safetensors.torch.save_file(torch_model.state_dict(), f)``).

    Standard layers use PyTorch's key names, so equivalent modules load directly. ``key_map`` renames keys
    for a ``Graph``: a dict ``{file_key: model_key}`` or a callable ``file_key -> model_key`` (return
    ``None`` to drop a key). Returns ``load_state_dict``'s ``IncompatibleKeys``.
    """
    from safetensors.numpy import load_file

    try:
        raw = load_file(os.fspath(path))
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"cannot read safetensors weights {os.fspath(path)!r}: {exc}") from exc
    mapped = {}
    for k, v in raw.items():
        nk = key_map.get(k, k) if isinstance(key_map, dict) else (key_map(k) if callable(key_map) else k)
        if nk is not None:
            mapped[nk] = tensor(v)
    return module.load_state_dict(mapped, strict=strict)


def key_map_by_order(module: Module, file_keys: list[str], file_shapes: dict[str, tuple]) -> dict[str, str]:
    """A ``key_map`` pairing file keys with the module's keys in order, checking every shape.

    For a Graph built to mirror a PyTorch ``nn.Sequential``: both list parameters in execution order.
    Raises CheckpointError on a count or shape mismatch (so it never silently pairs the wrong tensors).
    """
    own = list(module.state_dict().items())
    if len(own) != len(file_keys):
        raise CheckpointError(f"key_map_by_order: the file has {len(file_keys)} entries, the model {len(own)}")
    mapping = {}
    for fk, (mk, mv) in zip(file_keys, own):
        if tuple(file_shapes[fk]) != tuple(mv.shape) or fk.rpartition(".")[2] != mk.rpartition(".")[2]:
            raise CheckpointError(
                f"key_map_by_order: file key {fk!r} {tuple(file_shapes[fk])} does not fit model key {mk!r} "
                f"{tuple(mv.shape)}"
            )
        mapping[fk] = mk
    return mapping
