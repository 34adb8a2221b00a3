"""Tensor creation: ``tensor``, ``zeros``, ``ones``, ``full``, ``arange``, ``linspace``, ``eye``, the random
constructors, the ``*_like`` forms, ``manual_seed`` and ``from_dlpack``."""

from __future__ import annotations

import operator

import numpy as np

from ..backends.registry import get_backend, seed_all
from ..errors import BackendError, FlowError, ShapeError
from .dtype import DType, as_dtype, get_default_dtype
from .tensor import Tensor, _wrap

_INT64 = np.dtype(np.int64)


def _backend(device):
    return get_backend("cpu" if device is None else device)


def _infer_dtype(arr: np.ndarray, data) -> DType:
    kind = arr.dtype.kind
    if kind == "f" and not isinstance(data, np.ndarray) and not isinstance(data, np.generic):
        return get_default_dtype()  # Python floats: the default dtype, as in PyTorch
    if kind in "iu" and not isinstance(data, (np.ndarray, np.generic)):
        return as_dtype("int64")
    if kind == "O" or kind in "USc":
        raise FlowError(f"tensor(): data must be numbers, bools, (nested) lists of them, an array or a tensor; "
                        f"got {type(data).__name__} {_short(data)} (NumPy dtype {arr.dtype})")
    return as_dtype(arr.dtype)


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _collect_tensors(data):
    """Lists may hold 0-d tensors (``[t1, t2]``): turn them into host values."""
    if isinstance(data, Tensor):
        return data._backend.to_host(data._data)
    if isinstance(data, (list, tuple)):
        return [_collect_tensors(x) for x in data]
    return data


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor copying ``data`` (nested lists, scalars, numpy arrays, tensors).

    Python floats give the default dtype (float32), ints give int64, bools give bool.
    """
    bk = _backend(device)
    if isinstance(data, Tensor):
        out = data.detach().to(bk.device if device is not None else data.device)
        out = out.to(dtype) if dtype is not None else out
        out = _wrap(out._backend.contiguous(out._data) if out._data is not data._data
                    else out._backend.contiguous(out._backend.add(out._data, 0)), out._backend)
        return out.requires_grad_(requires_grad) if requires_grad else out
    data = _collect_tensors(data)
    from_python = not isinstance(data, np.ndarray)
    try:
        arr = np.asarray(data)
    except OverflowError as exc:
        raise FlowError(f"tensor(): an integer does not fit in 64 bits ({exc}); use a float dtype") from None
    except ValueError as exc:  # nested lists of different lengths
        raise FlowError(f"tensor(): data is ragged: nested lists must all have the same length at each depth, "
                        f"like a rectangular array ({exc})") from None
    dt = as_dtype(dtype) if dtype is not None else _infer_dtype(arr, data)
    if from_python and arr.size and arr.dtype.kind in "iuO" and dt.np.kind in "iu":
        _check_int_range(arr, dt)
    arr = np.array(arr, dtype=dt.np, order="C")  # a copy; np.ascontiguousarray would make 0-d arrays 1-d
    if dt.name == "float64" and not bk.supports_float64:
        raise BackendError(f"tensor(): {bk.device} does not support float64; use dtype=fg.float32")
    out = _wrap(bk.from_host(arr), bk)
    if requires_grad:
        out.requires_grad_(True)
    return out


def _check_int_range(arr: np.ndarray, dt) -> None:
    """Python integers that do not fit ``dt`` raise, as in PyTorch (NumPy would wrap them silently)."""
    info = np.iinfo(dt.np)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < info.min or hi > info.max:
        bad = lo if lo < info.min else hi
        raise FlowError(f"tensor(): value {bad} does not fit {dt} (range {info.min} .. {info.max}); "
                        "pass a wider dtype (fg.int64) or a float dtype")


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like ``tensor`` but returns ``data`` itself when it already is a tensor of that dtype/device."""
    if isinstance(data, Tensor):
        out = data
        if device is not None:
            out = out.to(device)
        return out.to(dtype) if dtype is not None else out
    return tensor(data, dtype=dtype, device=device)


def from_numpy(array: np.ndarray) -> Tensor:
    """A CPU tensor sharing memory with a numpy array."""
    return _wrap(array, get_backend("cpu"))


def _shape(size, where: str = "size") -> tuple[int, ...]:
    """``size`` as given to ``zeros(2, 3)`` or ``zeros((2, 3))``, checked: ints (or ``__index__`` objects,
    never bools or floats) that are >= 0."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    shape = []
    for s in size:
        if isinstance(s, bool) or not hasattr(type(s), "__index__"):
            raise FlowError(f"{where}: size must be ints, like (2, 3) or 2, 3; got {_short(tuple(size))}, "
                            f"whose element {_short(s)} is a {type(s).__name__}")
        shape.append(operator.index(s))
    for s in shape:
        if s < 0:
            raise ShapeError(f"{where}: size {tuple(shape)} has the negative dimension {s}; "
                             "every dimension must be >= 0")
    return tuple(shape)


def _float_dtype(dt: DType, where: str) -> DType:
    if not dt.is_floating_point:
        raise FlowError(f"{where}: dtype must be a floating-point dtype for random samples, got {dt}; "
                        "draw integers with randint")
    return dt


def full(size, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value``."""
    bk = _backend(device)
    if dtype is None:
        dtype = as_dtype("bool") if isinstance(fill_value, bool) else (
            as_dtype("int64") if isinstance(fill_value, int) else get_default_dtype())
    dt = as_dtype(dtype)
    out = _wrap(bk.full(_shape((size,), "full"), fill_value, dt.np), bk)
    return out.requires_grad_(True) if requires_grad else out


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros (default dtype float32)."""
    return full(_shape(size, "zeros"), 0, dtype or get_default_dtype(), device, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones (default dtype float32)."""
    return full(_shape(size, "ones"), 1, dtype or get_default_dtype(), device, requires_grad)


empty = zeros


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Values ``start, start+step, ...`` below ``end`` (int64 for integer arguments, else the default float)."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise FlowError("arange: step must be nonzero, got step=0")
    if (end - start) * step < 0:
        raise FlowError(f"arange: step={step} goes away from end={end} (start={start}); "
                        f"use step={-step} or swap start and end")
    if dtype is None:
        is_int = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
        dtype = as_dtype("int64") if is_int else get_default_dtype()
    dt = as_dtype(dtype)
    bk = _backend(device)
    out = _wrap(bk.arange(start, end, step, dt.np), bk)
    return out.requires_grad_(True) if requires_grad else out


def linspace(start: float, end: float, steps: int, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive."""
    if isinstance(steps, bool) or not hasattr(type(steps), "__index__") or operator.index(steps) < 0:
        raise FlowError(f"linspace: steps must be an int >= 0, got {steps!r}")
    dt = as_dtype(dtype) if dtype is not None else get_default_dtype()
    arr = np.linspace(start, end, steps, dtype=np.float64).astype(dt.np)
    return tensor(arr, dtype=dt, device=device, requires_grad=requires_grad)


def eye(n: int, m: int | None = None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """The identity matrix (``n`` x ``m``)."""
    n, m = _shape((n, n if m is None else m), "eye: n and m")
    dt = as_dtype(dtype) if dtype is not None else get_default_dtype()
    return tensor(np.eye(n, m, dtype=dt.np), dtype=dt, device=device,
                  requires_grad=requires_grad)


def manual_seed(seed: int) -> None:
    """Seed the generator of every device (reproducible ``rand``/``randn``/dropout/initialisation)."""
    if isinstance(seed, bool) or not hasattr(type(seed), "__index__"):
        raise FlowError(f"manual_seed: seed must be an int, got {type(seed).__name__} {seed!r}")
    seed_all(operator.index(seed))


def get_rng_state(device=None) -> Tensor:
    """The generator state of ``device`` (default ``"cpu"``) as an int64 CPU tensor, for ``set_rng_state``.

    Like ``torch.get_rng_state`` (and ``torch.cuda.get_rng_state(device)``); each device has its own
    generator, and the state's length depends on the device type::

        state = fg.get_rng_state("opencl")
        a = fg.rand(3, device="opencl")
        fg.set_rng_state(state, "opencl")
        b = fg.rand(3, device="opencl")      # the same numbers as a
    """
    words = _backend(device).get_rng_state()
    return _wrap(get_backend("cpu").from_host(np.array(words, dtype=np.int64)), get_backend("cpu"))


def set_rng_state(new_state: Tensor, device=None) -> None:
    """Restore the generator of ``device`` (default ``"cpu"``) to a state from ``get_rng_state`` on a
    device of the same type: the random draws that followed that state are drawn again."""
    bk = _backend(device)
    expected = len(bk.get_rng_state())
    if not isinstance(new_state, Tensor):
        raise FlowError(f"set_rng_state(new_state=...): expected the Tensor returned by fg.get_rng_state("
                        f"{bk.device!r}), got a {type(new_state).__name__}")
    host = new_state._backend.to_host(new_state._data)
    if host.dtype != _INT64 or host.shape != (expected,):
        raise FlowError(f"set_rng_state(new_state=...): a {bk.name} generator state is an int64 vector of "
                        f"{expected} words (from fg.get_rng_state({bk.device!r})), got dtype "
                        f"{new_state.dtype} shape {tuple(host.shape)}")
    bk.set_rng_state(host)


def rand(*size, dtype=None, device=None, requires_grad: bool = False, generator=None) -> Tensor:
    """Uniform samples in [0, 1)."""
    bk = _backend(device)
    dt = _float_dtype(as_dtype(dtype) if dtype is not None else get_default_dtype(), "rand")
    out = _wrap(bk.uniform(_shape(size, "rand"), dt.np), bk)
    return out.requires_grad_(True) if requires_grad else out


def randn(*size, dtype=None, device=None, requires_grad: bool = False, generator=None) -> Tensor:
    """Standard normal samples."""
    bk = _backend(device)
    dt = _float_dtype(as_dtype(dtype) if dtype is not None else get_default_dtype(), "randn")
    out = _wrap(bk.normal(_shape(size, "randn"), dt.np), bk)
    return out.requires_grad_(True) if requires_grad else out


def randint(low: int, high: int | None = None, size=(), dtype=None, device=None) -> Tensor:
    """Integers uniform in ``[low, high)``: ``randint(low, high, size)``, ``randint(high, size)`` (PyTorch's two
    positional forms) or keywords."""
    if isinstance(high, (tuple, list)) and size == ():  # randint(high, size)
        low, high, size = 0, low, high
    if high is None:
        low, high = 0, low
    size = _shape((size,), "randint")
    if high <= low:
        raise FlowError(f"randint: high ({high}) must be greater than low ({low})")
    bk = _backend(device)
    dt = as_dtype(dtype) if dtype is not None else as_dtype("int64")
    return _wrap(bk.randint(int(low), int(high), tuple(size), dt.np), bk)


def randperm(n: int, dtype=None, device=None) -> Tensor:
    """A random permutation of ``0..n-1`` (argsort of uniform keys, so it follows the device's seed)."""
    keys = rand(n, dtype=as_dtype("float64") if _backend(device).supports_float64 else None, device=device)
    host = np.argsort(keys.numpy(), kind="stable").astype(np.int64)
    return tensor(host, dtype=dtype or as_dtype("int64"), device=device)


def normal(mean: float = 0.0, std: float = 1.0, size=(), dtype=None, device=None) -> Tensor:
    """Normal samples with the given mean and standard deviation."""
    if not std >= 0:
        raise FlowError(f"normal: std must be >= 0, got {std!r}")
    return randn(*size, dtype=dtype, device=device) * std + mean


def bernoulli(p: Tensor) -> Tensor:
    """0/1 samples with probabilities ``p`` (same dtype as ``p``)."""
    return (rand(*p.shape, dtype=p.dtype, device=p.device) < p).to(p.dtype)


def _like(name: str, maker):
    def fn(t: Tensor, dtype=None, device=None, requires_grad: bool = False, **kwargs) -> Tensor:
        if not isinstance(t, Tensor):
            raise FlowError(f"{name}: input must be a Tensor, got {type(t).__name__}; "
                            f"use {name.removesuffix('_like')}(*shape) for a shape")
        return maker(t.shape, dtype=dtype or t.dtype, device=device or t.device, requires_grad=requires_grad,
                     **kwargs)

    fn.__name__ = name
    fn.__doc__ = f"``{name.removesuffix('_like')}`` with the shape, dtype and device of ``t``."
    return fn


zeros_like = _like("zeros_like", lambda s, **k: zeros(*s, **k))
ones_like = _like("ones_like", lambda s, **k: ones(*s, **k))
empty_like = zeros_like
rand_like = _like("rand_like", lambda s, **k: rand(*s, **k))
randn_like = _like("randn_like", lambda s, **k: randn(*s, **k))


def full_like(t: Tensor, fill_value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``full`` with the shape, dtype and device of ``t``."""
    return full(t.shape, fill_value, dtype=dtype or t.dtype, device=device or t.device, requires_grad=requires_grad)


def randint_like(t: Tensor, low: int, high: int | None = None, dtype=None, device=None) -> Tensor:
    """``randint`` with the shape of ``t``."""
    return randint(low, high, t.shape, dtype=dtype or t.dtype, device=device or t.device)


def from_dlpack(obj) -> Tensor:
    """Zero-copy import of a DLPack-capable array (numpy, torch, cupy, jax)."""
    if not hasattr(obj, "__dlpack_device__"):
        raise FlowError(f"from_dlpack: {type(obj).__name__} does not implement the DLPack protocol")
    kind, index = obj.__dlpack_device__()
    kind = int(kind)
    if kind == 1:
        bk = get_backend("cpu")
    elif kind in (2, 3):  # kDLCUDA, kDLCUDAHost
        bk = get_backend(f"cuda:{int(index)}")
    else:
        raise BackendError(f"from_dlpack: DLPack device type {kind} has no flowgraph backend (cpu=1, cuda=2)")
    return _wrap(bk.from_dlpack(obj), bk)

