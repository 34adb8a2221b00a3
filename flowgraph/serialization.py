"""``fg.save`` / ``fg.load``: a whole training state in one safetensors file, never pickle.

    fg.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter": 7,
             "config": {"lr": 3e-4, "betas": (0.9, 0.95)}}, "ckpt.fg")
    state = fg.load("ckpt.fg", map_location="cpu")
    model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"])

What can be saved: tensors (``fg.Tensor`` and ``nn.Parameter``), NumPy arrays, ``None``, ``bool``, ``int``,
``float`` (``inf`` and ``nan`` too), ``str``, flowgraph dtypes, and ``dict`` (any of those scalars as keys),
``OrderedDict``, ``list`` and ``tuple`` of them, nested to any depth. Anything else (a function, a module, an
arbitrary object) raises a ``CheckpointError`` naming where it sits, e.g. ``obj['config']['fn']``.

File layout: one safetensors file. Each tensor's values are an entry whose key is its place in the object
(``model/fc.weight``, ``optimizer/state/0/exp_avg``: dict keys and list indices joined by ``/``, with ``~`` and
``/`` inside a key written ``~0`` and ``~1`` as in a JSON pointer). The header's metadata holds the rest as JSON:
``format`` = ``"flowgraph.save"``, ``format_version``, ``object`` (the structure, tensors replaced by references),
``tensors`` (per entry: dtype and device) and ``checksums``. Loading reads JSON and raw bytes only.

Tensors, as ``torch.save``/``torch.load`` keep them:

* dtype (bfloat16, bool and the integer types included), shape, values bit for bit, and the device they were on
  (``map_location`` moves them);
* ``requires_grad``, and the class of an ``nn.Parameter``; a tensor that was the result of an op comes back as a
  leaf (its graph is not saved);
* sharing: the same tensor object saved in two places comes back as one object in both; two tensor objects over
  the same storage with the same shape (``state_dict()`` entries of tied weights) are stored once and come back
  as two tensors sharing one storage. A view of part of a tensor (``x[0]``, ``x.t()``) is stored as its own
  values: after loading it no longer shares memory with the tensor it was a view of (torch would keep the
  view of the whole storage).

The file helpers here (atomic write, bounded read, checksums, host conversion) are also those of
``flowgraph.tree``'s checkpoints: one implementation for every file flowgraph writes.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import tempfile
from collections import OrderedDict
from typing import Any

import numpy as np

from .errors import BackendError, CheckpointError
from .tensor import Tensor, tensor
from .tensor.dtype import ALL_DTYPES, DType, as_dtype

FORMAT = "flowgraph.save"
FORMAT_VERSION = "1"
_DTYPES = {d.name: d for d in ALL_DTYPES}


# ---------------------------------------------------------------------- host conversion and checksums
def to_host(t: Tensor) -> tuple[np.ndarray, str]:
    """A C-contiguous host copy of ``t``'s values and its dtype name (bfloat16 as its raw uint16 bits, the form
    safetensors stores)."""
    arr = np.array(t.detach()._backend.to_host(t.detach()._data), order="C", copy=True)
    name = t.dtype.name
    if name == "bfloat16":
        arr = arr.view(np.uint16)
    return arr, name


def from_host(arr: np.ndarray, dtype_name: str, key: str = "?", path: str = "?") -> np.ndarray:
    """The stored array as the dtype the metadata names; a stored dtype that cannot be that one is corrupt."""
    if dtype_name == "bfloat16":
        if arr.dtype != np.uint16:
            raise CheckpointError(f"checkpoint {path!r}: key {key!r} is stored as {arr.dtype} but its metadata says "
                                  "bfloat16 (stored as uint16); the file is corrupt")
        return arr.view(as_dtype("bfloat16").np)
    if str(arr.dtype) != dtype_name:
        raise CheckpointError(f"checkpoint {path!r}: key {key!r} is stored as {arr.dtype} but its metadata says "
                              f"{dtype_name}; the file is corrupt")
    return arr


def checksum(arr: np.ndarray) -> str:
    """A fast content checksum: byte length and the wrap-around sum of the data as 64-bit words (tail bytes
    added as one word). Any single changed byte changes it. It detects corruption, it does not authenticate:
    a cryptographic hash of 100 MB costs 160 ms here, this ~7 ms (a few % of loading it)."""
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    n = raw.size - raw.size % 8
    total = int(raw[:n].view(np.uint64).sum(dtype=np.uint64)) if n else 0
    if n < raw.size:
        total = (total + int.from_bytes(raw[n:].tobytes(), "little")) % (1 << 64)
    return f"{raw.size}:{total:016x}"


def verify_checksums(raw: dict[str, np.ndarray], checksums: dict[str, str], path: str) -> None:
    """Raise ``CheckpointError`` naming the first entry whose data does not match its stored checksum."""
    for key, arr in raw.items():
        if checksums.get(key) != checksum(arr):
            raise CheckpointError(
                f"checkpoint {path!r}: the data of key {key!r} does not match its checksum (stored "
                f"{checksums.get(key)!r}, read {checksum(arr)!r}); the file is corrupt. Restore it from a copy"
            )


# ---------------------------------------------------------------------- atomic write
def _remove_stale_temps(path: str) -> None:
    """Remove temp files an interrupted save of ``path`` left (``.name.<pid>.XXXX.tmp``) whose writer process is
    gone: a SIGKILL mid-save must not leave model-sized files behind forever. Live writers are left alone."""
    directory, base = os.path.split(os.path.abspath(path))
    prefix = f".{base}."
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix):].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _pid_alive(int(pid_text)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is always either the old file or the complete new one: a temp
    file beside it, fsynced, renamed over it, the directory fsynced. ``CheckpointError`` when it cannot."""
    path = os.fspath(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise CheckpointError(f"cannot use path {path!r}: {exc}") from exc
    # Only a regular file is ever replaced (renaming over /dev/null as root would replace the device node).
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise CheckpointError(f"path {path!r} is a directory; pass a file path in it, "
                              f"e.g. {os.path.join(path, 'model.safetensors')!r}")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"path {path!r} exists and is not a regular file (a FIFO, socket or device); "
                              "a checkpoint only replaces regular files: pass another path")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        _remove_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{os.getpid()}.", suffix=".tmp", dir=directory)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as open() would create it (mkstemp makes 0600 whatever the umask)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path!r}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        try:
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass  # directories cannot be fsynced on some platforms; the rename is still atomic
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot write checkpoint {path!r}: {exc}") from exc
        raise


# ---------------------------------------------------------------------- bounded read
def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file: ``(arrays by key, header metadata)``, CheckpointError for anything malformed.

    The read is bounded by the file's size (a FIFO or device is refused, not read forever), and the header
    length is checked against the bytes present before anything is parsed. Checksums and the format are the
    caller's to check.
    """
    path = os.fspath(path)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"checkpoint {path!r} is not a regular file (a FIFO, device or directory); "
                                  "pass the path of a .safetensors file")
        with open(path, "rb") as fh:
            data = fh.read(info.st_size + 1)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {exc}") from exc
    return parse_safetensors(data, path)


def parse_safetensors(data: bytes, path: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Parse the bytes of a safetensors file (see :func:`read_safetensors`)."""
    from safetensors.numpy import load

    if len(data) < 8:
        raise CheckpointError(f"checkpoint {path!r} is truncated or not a safetensors file ({len(data)} bytes)")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise CheckpointError(
            f"checkpoint {path!r} is truncated: its header claims {header_len} bytes, the file has {len(data) - 8}"
        )
    try:
        header = json.loads(data[8:8 + header_len])
        metadata = header.get("__metadata__") or {}
        if not isinstance(metadata, dict):
            raise ValueError("__metadata__ is not a mapping")
        raw = load(data)
    except Exception as exc:  # noqa: BLE001 - any parse failure means a corrupt file
        raise CheckpointError(f"checkpoint {path!r} is corrupt: {exc}") from exc
    return raw, metadata


def json_metadata(metadata: dict, name: str, path: str, kind: type = dict) -> Any:
    """``metadata[name]`` parsed as JSON of type ``kind``; CheckpointError when it is missing or anything else."""
    try:
        value = json.loads(metadata[name])
    except (KeyError, TypeError, RecursionError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path!r} has missing or corrupt {name!r} metadata: {exc!r}") from exc
    if not isinstance(value, kind):
        raise CheckpointError(f"checkpoint {path!r} has corrupt {name!r} metadata: expected a JSON "
                              f"{'object' if kind is dict else kind.__name__}")
    return value


# ---------------------------------------------------------------------- the object <-> JSON structure
def _where(path: tuple) -> str:
    """``obj['config']['fn']``, ``obj['layers'][3]``: how an error names a place inside the saved object."""
    return "obj" + "".join(f"[{p!r}]" for p in path)


def _key_part(part: Any) -> str:
    text = str(part)
    return text.replace("~", "~0").replace("/", "~1")


class _Encoder:
    """Turns the object into JSON-able structure, collecting tensor values as safetensors entries."""

    def __init__(self, allow_tensors: bool, what: str):
        self.allow_tensors = allow_tensors
        self.what = what
        self.arrays: dict[str, np.ndarray] = {}
        self.info: dict[str, dict[str, Any]] = {}
        self.objects: dict[int, int] = {}  # id(tensor) -> object number
        self.storages: dict[tuple, str] = {}  # (id(native array), shape, dtype) -> entry key
        self.keep: list[Any] = []  # keeps the ids above unique while encoding
        self.active: set[int] = set()

    def fail(self, path: tuple, message: str) -> CheckpointError:
        return CheckpointError(f"{self.what}: {_where(path)}: {message}")

    def encode(self, obj: Any, path: tuple) -> Any:
        if obj is None or type(obj) in (bool, str):
            return obj
        if isinstance(obj, int) and type(obj) is int:
            return obj
        if type(obj) is float:
            return obj if math.isfinite(obj) else {"@float": repr(obj)}  # 'inf', '-inf', 'nan'
        if isinstance(obj, Tensor):
            return self._tensor(obj, path)
        if isinstance(obj, DType):
            return {"@dtype": obj.name}
        if isinstance(obj, np.ndarray):
            return self._ndarray(obj, path)
        if type(obj) in (dict, OrderedDict, list, tuple):
            if id(obj) in self.active:
                raise self.fail(path, "the object contains itself (a reference cycle); save a structure "
                                      "without cycles")
            self.active.add(id(obj))
            try:
                return self._container(obj, path)
            finally:
                self.active.discard(id(obj))
        raise self.fail(path, _unsupported(obj))

    def _container(self, obj: Any, path: tuple) -> Any:
        if isinstance(obj, list):
            return [self.encode(v, path + (i,)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return {"@tuple": [self.encode(v, path + (i,)) for i, v in enumerate(obj)]}
        plain = all(type(k) is str and not k.startswith("@") for k in obj)
        if plain:
            body: Any = {k: self.encode(v, path + (k,)) for k, v in obj.items()}
        else:
            body = {"@items": [[self._dict_key(k, path), self.encode(v, path + (k,))] for k, v in obj.items()]}
        return {"@odict": body} if type(obj) is OrderedDict else body

    def _dict_key(self, key: Any, path: tuple) -> Any:
        if key is None or type(key) in (bool, int, float, str):
            return self.encode(key, path)
        if type(key) is tuple:
            return {"@tuple": [self._dict_key(k, path) for k in key]}
        raise self.fail(path, f"a dict key of type {type(key).__name__} ({key!r}) cannot be saved; use str, int, "
                              "float, bool, None or tuples of them as keys")

    def _entry_key(self, path: tuple) -> str:
        key = "/".join(_key_part(p) for p in path) or "@root"
        if key in self.arrays:
            n = 2
            while f"{key}~{n}" in self.arrays:
                n += 1
            key = f"{key}~{n}"
        return key

    def _tensor(self, t: Tensor, path: tuple) -> dict:
        if not self.allow_tensors:
            raise self.fail(path, "a tensor cannot be stored in checkpoint metadata; save it with fg.save")
        ref: dict[str, Any] = {}
        number = self.objects.get(id(t))
        if number is None:
            number = self.objects[id(t)] = len(self.objects)
            self.keep.append(t)
        storage = (id(t._data), tuple(t.shape), t.dtype.name)
        key = self.storages.get(storage)
        if key is None:
            key = self._entry_key(path)
            self.arrays[key], dtype_name = to_host(t)
            self.info[key] = {"dtype": dtype_name, "device": t.device}
            self.storages[storage] = key
            self.keep.append(t._data)
        ref["@tensor"] = key
        ref["object"] = number
        if t.requires_grad:
            ref["requires_grad"] = True
        if type(t) is not Tensor:
            from .nn.module import Parameter

            if not isinstance(t, Parameter):
                raise self.fail(path, f"a tensor subclass {type(t).__name__} cannot be saved; save a plain tensor "
                                      "(t.detach()) or an nn.Parameter")
            ref["parameter"] = True
        return ref

    def _ndarray(self, arr: np.ndarray, path: tuple) -> dict:
        if not self.allow_tensors:
            raise self.fail(path, "a NumPy array cannot be stored in checkpoint metadata; use lists or fg.save")
        if arr.dtype not in {d.np for d in ALL_DTYPES}:
            raise self.fail(path, f"a NumPy array of dtype {arr.dtype} cannot be saved; use a numeric or bool "
                                  "array (convert strings or objects to lists)")
        key = self._entry_key(path)
        name = as_dtype(arr.dtype).name
        host = np.array(arr, order="C", copy=True)
        self.arrays[key] = host.view(np.uint16) if name == "bfloat16" else host
        self.info[key] = {"dtype": name, "device": "numpy"}
        return {"@ndarray": key}


def _unsupported(obj: Any) -> str:
    """What the object is and what to save instead."""
    import types

    kind = type(obj)
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)) or (
            callable(obj) and kind.__name__ in ("function", "partial")):
        return "a function cannot be saved; save its name (or the arguments that rebuild it) instead"
    if isinstance(obj, type):
        return f"a class ({obj.__name__}) cannot be saved; save its name instead"
    names = [c.__name__ for c in kind.__mro__]
    if "Module" in names and hasattr(obj, "state_dict"):
        return f"a module ({kind.__name__}) cannot be saved; save module.state_dict() and rebuild the module"
    if "Optimizer" in names and hasattr(obj, "state_dict"):
        return f"an optimizer ({kind.__name__}) cannot be saved; save optimizer.state_dict()"
    if isinstance(obj, tuple):
        return f"a {kind.__name__} (a tuple subclass) cannot be saved; save tuple(x) or x._asdict()"
    if isinstance(obj, dict):
        return f"a {kind.__name__} (a dict subclass) cannot be saved; save dict(x)"
    if isinstance(obj, np.generic):
        return f"a NumPy scalar ({kind.__name__}) cannot be saved; save x.item() (a Python number)"
    if isinstance(obj, (set, frozenset)):
        return f"a {kind.__name__} cannot be saved; save sorted(x) or list(x)"
    if isinstance(obj, (bytes, bytearray)):
        return "bytes cannot be saved; save a str or a uint8 tensor"
    if isinstance(obj, (int, float)):
        return f"a {kind.__name__} (a number subclass) cannot be saved; save int(x) or float(x)"
    return (f"a {kind.__module__}.{kind.__qualname__} cannot be saved; fg.save stores tensors, NumPy arrays, "
            "numbers, strings, None, dtypes and dicts/lists/tuples of them (no pickle), so save the values that "
            "rebuild it")


class _Decoder:
    """Rebuilds the object from its JSON structure and the file's arrays."""

    def __init__(self, arrays: dict[str, np.ndarray], info: dict[str, Any], map_location: Any, path: str):
        self.arrays = arrays
        self.info = info
        self.map_location = map_location
        self.path = path
        self.objects: dict[int, Tensor] = {}
        self.storages: dict[tuple[str, str], Tensor] = {}

    def corrupt(self, message: str) -> CheckpointError:
        return CheckpointError(f"file {self.path!r} has a corrupt 'object' structure: {message}")

    def decode(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v) for v in node]
        if not isinstance(node, dict):
            raise self.corrupt(f"unexpected JSON value {node!r}")
        tags = [k for k in node if k.startswith("@")]
        if not tags:
            return {k: self.decode(v) for k, v in node.items()}
        if len(tags) != 1:
            raise self.corrupt(f"an entry with several tags {tags}")
        tag = tags[0]
        value = node[tag]
        if tag == "@float" and value in ("inf", "-inf", "nan"):
            return float(value)
        if tag == "@tuple" and isinstance(value, list):
            return tuple(self.decode(v) for v in value)
        if tag == "@items" and isinstance(value, list):
            if not all(isinstance(kv, list) and len(kv) == 2 for kv in value):
                raise self.corrupt("'@items' holds something other than [key, value] pairs")
            return {self.decode(k): self.decode(v) for k, v in value}
        if tag == "@odict":
            inner = self.decode(value)
            if not isinstance(inner, dict):
                raise self.corrupt("'@odict' does not hold a dict")
            return OrderedDict(inner)
        if tag == "@dtype" and value in _DTYPES:
            return _DTYPES[value]
        if tag == "@tensor":
            return self._tensor(node)
        if tag == "@ndarray":
            arr = self._array(value)
            return np.array(arr)
        raise self.corrupt(f"unknown or malformed entry {tag!r}: {value!r}")

    def _array(self, key: Any) -> np.ndarray:
        if not isinstance(key, str) or key not in self.arrays or key not in self.info:
            raise self.corrupt(f"a reference to the entry {key!r}, which the file does not hold")
        entry = self.info[key]
        if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
            raise self.corrupt(f"entry {key!r} has no valid dtype")
        return from_host(self.arrays[key], entry["dtype"], key, self.path)

    def _device(self, saved: str) -> str:
        target = self.map_location
        if isinstance(target, dict):
            target = target.get(saved, saved)
        if target is None:
            target = saved
        from .backends import get_backend

        try:
            return get_backend(target).device
        except BackendError as exc:
            where = f"saved on {saved!r}" if target == saved else f"saved on {saved!r} and mapped to {target!r}"
            raise CheckpointError(
                f"file {self.path!r}: a tensor {where} cannot be placed on that device here ({exc}); load with "
                "map_location='cpu' (or another available device)"
            ) from exc

    def _tensor(self, node: dict) -> Tensor:
        key = node["@tensor"]
        number = node.get("object")
        if not isinstance(number, int):
            raise self.corrupt(f"tensor reference {node!r} has no object number")
        if number in self.objects:
            return self.objects[number]
        arr = self._array(key)
        device = self._device(str(self.info[key].get("device", "cpu")))
        shared = self.storages.get((key, device))
        if shared is None:
            shared = tensor(arr, dtype=_DTYPES[self.info[key]["dtype"]], device=device)
            self.storages[(key, device)] = shared
            out = shared
        else:
            out = shared.detach()  # another tensor over the same storage, as saved
        requires_grad = node.get("requires_grad", False) is True
        if node.get("parameter") is True:
            from .nn.module import Parameter

            out = Parameter(out, requires_grad=requires_grad)
        elif requires_grad:
            out.requires_grad_(True)
        self.objects[number] = out
        return out


# ---------------------------------------------------------------------- save / load
def encode_metadata(value: Any, what: str) -> str:
    """``value`` (numbers, strings, None, dicts/lists/tuples of them) as the JSON text :func:`decode_metadata`
    reads back exactly (tuples, int keys and non-finite floats included); CheckpointError naming the place of
    anything else."""
    return json.dumps(_Encoder(allow_tensors=False, what=what).encode(value, ()), allow_nan=False)


def decode_metadata(text: str, path: str) -> Any:
    """The value :func:`encode_metadata` wrote."""
    try:
        node = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"file {path!r} has corrupt JSON metadata: {exc}") from exc
    return _Decoder({}, {}, None, path).decode(node)


def save(obj: Any, f: str | os.PathLike | Any) -> None:
    """Save ``obj`` (nested dicts, lists and tuples of tensors, numbers, strings, ...) to ``f``, as ``torch.save``.

    ``f`` is a path (written atomically: the file is either the old one or the complete new one, even if the
    process is killed mid-save) or a binary file object. The file is safetensors: nothing in it is executable.
    See the module docstring for what is kept (dtypes, devices, ``requires_grad``, sharing) and what cannot be
    saved (``CheckpointError`` naming the place, e.g. ``obj['config']['fn']``).

        fg.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter": 7}, "ckpt.fg")
    """
    from safetensors.numpy import save as st_save

    encoder = _Encoder(allow_tensors=True, what="fg.save")
    try:
        structure = encoder.encode(obj, ())
    except RecursionError as exc:
        raise CheckpointError("fg.save: the object is nested too deeply to save (Python's recursion limit); "
                              "flatten it") from exc
    metadata = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "object": json.dumps(structure, allow_nan=False),
        "tensors": json.dumps(encoder.info),
        "checksums": json.dumps({k: checksum(v) for k, v in encoder.arrays.items()}),
    }
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "<file object>")
    try:
        data = st_save(encoder.arrays, metadata=metadata)
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types
        raise CheckpointError(f"cannot serialise {name!r}: {exc}") from exc
    if isinstance(f, (str, os.PathLike)):
        atomic_write(f, data)
    elif hasattr(f, "write"):
        f.write(data)
    else:
        raise CheckpointError(f"fg.save: f must be a path or a binary file object, got {type(f).__name__}")


def load(f: str | os.PathLike | Any, map_location: Any = None, *, device: Any = None,
         weights_only: bool | None = None) -> Any:
    """Load what :func:`save` wrote, as ``torch.load``.

    ``map_location`` (or its alias ``device``): ``None`` puts each tensor back on the device it was saved from;
    a device (``"cpu"``, ``"cuda:1"``) puts every tensor there; a dict ``{"cuda:0": "cpu"}`` maps saved devices.
    ``weights_only`` is accepted for scripts written for ``torch.load`` and changes nothing: loading never runs
    code. A corrupt, truncated or foreign file raises ``CheckpointError``.
    """
    del weights_only  # always "weights only": the file holds JSON and raw bytes
    if device is not None:
        if map_location is not None and map_location != device:
            raise CheckpointError(f"fg.load: map_location={map_location!r} and device={device!r} disagree; pass "
                                  "one of them")
        map_location = device
    if isinstance(map_location, dict):
        from .backends import parse_device

        map_location = {parse_device(k): v for k, v in map_location.items()}
    elif map_location is not None and not isinstance(map_location, str):
        from .backends import parse_device

        try:
            map_location = parse_device(map_location)
        except BackendError as exc:
            raise CheckpointError(f"fg.load: map_location must be None, a device string or a dict of device "
                                  f"strings, got {map_location!r}") from exc
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        arrays, metadata = read_safetensors(path)
    elif hasattr(f, "read"):
        path = str(getattr(f, "name", "<file object>"))
        arrays, metadata = parse_safetensors(f.read(), path)
    else:
        raise CheckpointError(f"fg.load: f must be a path or a binary file object, got {type(f).__name__}")
    if metadata.get("format") != FORMAT:
        hint = ("it is a model checkpoint: load it with g.load_checkpoint(path) or flowgraph.tree.load_checkpoint"
                if metadata.get("format") == "flowgraph.checkpoint" else
                "plain safetensors weights load with flowgraph.tree.load_safetensors_weights")
        raise CheckpointError(f"{path!r} was not written by fg.save (format={metadata.get('format')!r}); {hint}")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path!r} has fg.save format version {metadata.get('format_version')!r}; this "
                              f"flowgraph reads version {FORMAT_VERSION}")
    checksums = json_metadata(metadata, "checksums", path)
    if set(checksums) != set(arrays):
        raise CheckpointError(f"{path!r} is corrupt: its entries {sorted(arrays)[:5]} do not match the checksum "
                              f"list {sorted(checksums)[:5]}")
    verify_checksums(arrays, checksums, path)
    info = json_metadata(metadata, "tensors", path)
    structure = json_metadata(metadata, "object", path, object)
    decoder = _Decoder(arrays, info, map_location, path)
    try:
        return decoder.decode(structure)
    except RecursionError as exc:
        raise CheckpointError(f"{path!r}: the saved object is nested too deeply to load") from exc
    except (TypeError, ValueError, AttributeError) as exc:  # e.g. a list used as a dict key in a crafted file
        raise decoder.corrupt(repr(exc)) from exc


__all__ = ["load", "save"]
