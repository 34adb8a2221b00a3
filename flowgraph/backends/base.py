"""The backend protocol: the small set of primitives every device implements.

A backend owns one device and works on its *native arrays* (``numpy.ndarray`` on the CPU, ``cupy.ndarray``
on CUDA, flowgraph's own strided ``CLArray`` on OpenCL). Everything above this layer (tensor ops,
autograd, nn, optimizers) is written once in terms of these primitives, so a new backend gets every op
and every gradient by implementing this class.

Contract shared by all primitives:

* Arrays expose ``.shape`` (tuple of ints), ``.ndim`` and ``.dtype`` (a ``numpy.dtype``; bfloat16 is
  ``ml_dtypes.bfloat16``). Nothing else about an array is assumed by the layers above.
* Binary elementwise ops receive two arrays *of the same dtype* (the tensor layer promotes first)
  broadcast NumPy-style, or an array and a Python scalar on either side (the scalar takes the array's
  dtype). Comparisons return ``bool`` arrays.
* Axes are non-negative ints already normalised by the caller; shapes are tuples.
* Results may be views of their inputs (reshape, permute, expand, slice, flip) where the device can do
  that; callers never write into a result unless it came from ``assign``'s target.
* A backend may defer and fuse work (the accelerated ones do); ``to_host`` and ``synchronize`` are the
  points where pending work must be finished.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError

Array = Any
Shape = tuple[int, ...]

#: Names of the unary elementwise primitives (float in, same dtype out unless noted).
UNARY_OPS: tuple[str, ...] = (
    "neg", "exp", "log", "sqrt", "sin", "cos", "tanh", "erf", "abs", "sign", "reciprocal",
    "log1p", "expm1", "floor", "ceil", "round", "logical_not", "isnan", "isinf",
)
#: Names of the binary elementwise primitives.
BINARY_OPS: tuple[str, ...] = (
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "floor_divide", "remainder", "atan2",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
)
#: Reductions over a tuple of axes: ``op(a, axes, keepdims)``.
REDUCE_OPS: tuple[str, ...] = ("sum", "prod", "max", "min", "any", "all")


def _missing(backend: Backend, name: str | None = None) -> BackendError:
    """The error for a primitive a backend has not implemented."""
    import inspect

    name = name or inspect.stack()[1].function
    return BackendError(
        f"backend {type(backend).__name__} ({backend.device}) has no primitive {name!r}; "
        "every backend must implement the full protocol in flowgraph/backends/base.py"
    )


def nocopy_strides(shape: Shape, strides: tuple[int, ...], new_shape: Shape) -> tuple[int, ...] | None:
    """Strides that lay ``new_shape`` over the same elements as ``(shape, strides)`` without moving them, or
    ``None`` when a copy is needed (NumPy's no-copy reshape rule: each group of old axes that merges into or
    splits into new axes must itself be contiguous). Strides in any unit (elements or bytes). Lets ``a[:, 1]``
    and similar squeezes, and a split of a sliced axis, stay views (``Backend.reshape_view``)."""
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if any(n == 0 for n in shape):
        return None
    new_n, old_n = len(new_shape), len(old)
    out = [0] * new_n
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < new_n and oi < old_n:
        np_, op = new_shape[ni], old[oi][0]
        while np_ != op:
            if np_ < op:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new_shape[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    last = out[ni - 1] if ni >= 1 else 1
    for k in range(ni, new_n):
        out[k] = last
    return tuple(out)


class Backend:
    """Abstract backend. Subclasses implement every method below for one device.

    ``name`` is the device type (``"cpu"``, ``"cuda"``, ``"opencl"``) and ``device`` the full device
    string (``"cpu"``, ``"cuda:0"``, ``"opencl:1"``).
    """

    name: str = "abstract"
    device: str = "abstract"
    #: Whether the device computes float64 (``False`` on OpenCL devices without ``cl_khr_fp64``).
    supports_float64: bool = True
    #: Whether the device computes float16.
    supports_float16: bool = True

    # ----------------------------------------------------------------- host exchange and creation
    def from_host(self, array: np.ndarray) -> Array:
        """Copy a host ``numpy.ndarray`` to this device (dtype kept)."""
        raise _missing(self)

    def to_host(self, a: Array) -> np.ndarray:
        """Copy ``a`` to a host ``numpy.ndarray`` (finishes pending work)."""
        raise _missing(self)

    def full(self, shape: Shape, value: float | int | bool, dtype: np.dtype) -> Array:
        """A new array filled with ``value``."""
        raise _missing(self)

    def arange(self, start: float, stop: float, step: float, dtype: np.dtype) -> Array:
        """``[start, start+step, ...)`` below ``stop``, NumPy semantics."""
        raise _missing(self)

    # ----------------------------------------------------------------- random (seeded, reproducible)
    def seed(self, seed: int) -> None:
        """Reset this device's generator."""
        raise _missing(self)

    def get_rng_state(self) -> np.ndarray:
        """This device's generator state as a host int64 vector (its layout is the backend's own)."""
        raise _missing(self)

    def set_rng_state(self, state: np.ndarray) -> None:
        """Restore a state returned by ``get_rng_state`` of a backend of the same type: the draws that
        followed it are drawn again."""
        raise _missing(self)

    def uniform(self, shape: Shape, dtype: np.dtype) -> Array:
        """Uniform samples in [0, 1)."""
        raise _missing(self)

    def normal(self, shape: Shape, dtype: np.dtype) -> Array:
        """Standard normal samples."""
        raise _missing(self)

    def randint(self, low: int, high: int, shape: Shape, dtype: np.dtype) -> Array:
        """Integers uniform in [low, high)."""
        raise _missing(self)

    # ----------------------------------------------------------------- elementwise
    def where(self, cond: Array, a: Array, b: Array) -> Array:
        """``cond ? a : b`` with broadcasting; ``a``/``b`` same dtype or scalars."""
        raise _missing(self)

    def cast(self, a: Array, dtype: np.dtype) -> Array:
        """Convert to ``dtype`` (returns ``a`` itself when it already has it)."""
        raise _missing(self)

    # ----------------------------------------------------------------- reductions and scans
    def argmax(self, a: Array, axis: int, keepdims: bool) -> Array:
        """Index (int64) of the first maximum along ``axis``."""
        raise _missing(self)

    def argmin(self, a: Array, axis: int, keepdims: bool) -> Array:
        """Index (int64) of the first minimum along ``axis``."""
        raise _missing(self)

    def cumsum(self, a: Array, axis: int) -> Array:
        """Inclusive prefix sum along ``axis``."""
        raise _missing(self)

    def argsort(self, a: Array, axis: int, descending: bool) -> Array:
        """Stable sort order (int64) along ``axis``; NaN sorts last ascending and first descending (PyTorch's
        order). On the device: ``sort``/``argsort``/``topk`` never copy to the host."""
        raise _missing(self)

    # ----------------------------------------------------------------- movement (views where possible)
    def reshape(self, a: Array, shape: Shape) -> Array:
        """Same elements in row-major order, new shape (a view when ``a`` is contiguous)."""
        raise _missing(self)

    def permute(self, a: Array, axes: Sequence[int]) -> Array:
        """Reorder axes (a view)."""
        raise _missing(self)

    def expand(self, a: Array, shape: Shape) -> Array:
        """Broadcast to ``shape`` (a view with zero strides)."""
        raise _missing(self)

    def slice(self, a: Array, index: tuple[slice, ...]) -> Array:
        """Basic slicing with one ``slice(start, stop, step>0)`` per axis, bounds already clipped (a view)."""
        raise _missing(self)

    def flip(self, a: Array, axes: Sequence[int]) -> Array:
        """Reverse the order along ``axes``."""
        raise _missing(self)

    def pad(self, a: Array, widths: Sequence[tuple[int, int]], value: float) -> Array:
        """Constant padding; ``widths`` has a (before, after) pair per axis, both >= 0."""
        raise _missing(self)

    def concatenate(self, arrays: Sequence[Array], axis: int) -> Array:
        """Join same-dtype arrays along an existing axis."""
        raise _missing(self)

    def contiguous(self, a: Array) -> Array:
        """A row-major array with its own storage (``a`` itself if it already is one)."""
        raise _missing(self)

    def realize(self, a: Array) -> Array:
        """Compute ``a`` now where the backend defers elementwise work (CUDA and OpenCL build fused expressions
        lazily), so that the arrays its pending expression reads can be freed; returns ``a``, realized in place.
        A no-op for backends that compute at once."""
        return a

    def reshape_view(self, a: Array, shape: Shape) -> Array | None:
        """``a`` reshaped to ``shape`` as a view sharing its storage, or None where its layout needs a copy
        (``Tensor.reshape`` then copies, and the result is not a view): PyTorch's rule, by which a split of a
        sliced or permuted axis stays a view (``nocopy_strides``) and an in-place write through it reaches the
        base. Generic default over ``is_contiguous`` and ``_strides``."""
        if self.is_contiguous(a):
            return self.reshape(a, shape)
        strides = self._strides(a)
        if strides is not None and nocopy_strides(tuple(a.shape), strides, tuple(int(n) for n in shape)) is not None:
            return self.reshape(a, shape)  # the backend's reshape makes the view then
        return None

    def _strides(self, a: Array) -> tuple[int, ...] | None:
        """The strides of a realized strided array (any unit), or None where the backend keeps no strided views
        (``reshape_view`` then views row-major arrays only)."""
        return None

    def replay_call(self, fn: Callable[..., Any], args: tuple, kwargs: dict, out: Any) -> Callable[..., Any]:
        """What a recorded ``fg.jit`` step calls on replay in place of the backend call ``fn(*args, **kwargs)``,
        which gave ``out`` while the step was recorded: ``fn`` itself, or an equivalent that computes the same
        values, laid out as ``out`` is (later calls of the step depend on that layout), in less time. The
        recorder asks once per call; a replay pays nothing for the question."""
        return fn

    def is_contiguous(self, a: Array) -> bool:
        """Whether ``a`` is laid out row-major (``Tensor.is_contiguous``). Generic default from ``contiguous``'s
        contract (``a`` itself when already row-major): it may copy a strided array, so backends with a
        layout of their own answer from it instead."""
        return self.contiguous(a) is a

    def assign(self, dst: Array, src: Array | float) -> Array:
        """Write ``src`` (broadcast) into ``dst`` in place and return the array now holding the values.

        ``dst`` may be a view: the write lands in the storage it shares with its base.
        """
        raise _missing(self)

    # ----------------------------------------------------------------- linear algebra
    def matmul(self, a: Array, b: Array) -> Array:
        """Batched matrix product with NumPy ``matmul`` semantics for ndim >= 2."""
        raise _missing(self)

    # ----------------------------------------------------------------- indexing
    def gather(self, a: Array, axis: int, index: Array) -> Array:
        """``take_along_axis``: ``out[i][j][k] = a[i][index[i][j][k]][k]`` for axis 1; ``index`` is int64."""
        raise _missing(self)

    def scatter_add(self, a: Array, axis: int, index: Array, src: Array) -> Array:
        """A copy of ``a`` with ``src`` added at ``index`` along ``axis`` (duplicates accumulate)."""
        raise _missing(self)

    def scatter(self, a: Array, axis: int, index: Array, src: Array) -> Array:
        """A copy of ``a`` with ``src`` written at ``index`` along ``axis`` (last write wins)."""
        raise _missing(self)

    # ----------------------------------------------------------------- declared capabilities (generic defaults)
    def add_into(self, dst: Array, src: Array) -> Array:
        """``dst + src`` (same dtype; ``src`` of ``dst``'s shape or broadcasting to it, as a bias row),
        written into ``dst`` and returned where the backend can add in place, else a new array: the autograd
        engine accumulates into sums it made itself and checks ``result is dst``; a linear layer adds its bias
        into the GEMM's fresh output. The generic default returns a new sum."""
        return self.add(dst, src)

    #: Whether ``matmul_accumulate`` and ``bias_grad_accumulate`` add into their destination in the kernel itself
    #: (a GEMM with ``beta = 1``): linear layers then return their parameters' gradients deferred
    #: (``autograd.node.DeferredGrad``), so a weight shared by many steps of a loop costs one GEMM per step and
    #: no separate add.
    accumulates_in_place = False

    #: Whether elementwise results may be pending expressions (the lazy engine of the device backends): the
    #: tensor layer then tells the backend which values autograd saved (``mark_saved``).
    defers_elementwise = False

    def is_pending(self, a: Array) -> bool:
        """Whether ``a`` is a lazy backend's pending expression (not computed yet); False on eager backends."""
        return False

    def mark_saved(self, a: Array) -> None:
        """Autograd saved ``a`` for backward. A lazy backend writes a pending ``a`` out in the kernel that
        computes it, so backward reads it instead of recomputing it; eager backends have nothing to do."""

    def matmul_accumulate(self, dst: Array, a: Array, b: Array) -> Array:
        """``dst + a @ b`` for 2-d ``a``, ``b`` and a ``dst`` of the product's shape and dtype, written into
        ``dst`` and returned where the backend can (the autograd engine's own running sums), else a new array.
        The generic default is ``add_into(dst, matmul(a, b))``."""
        return self.add_into(dst, self.matmul(a, b))

    def bias_grad_accumulate(self, dst: Array, g: Array) -> Array:
        """``dst + bias_grad(g)`` for a 2-d ``g`` ``(rows, cols)`` and a ``dst`` ``(cols,)`` of its dtype, written
        into ``dst`` and returned where the backend can, else a new array. Generic default:
        ``add_into(dst, bias_grad(g))``."""
        return self.add_into(dst, self.bias_grad(g))

    def gelu_exact(self, x: Array, grad: bool = True) -> tuple[Array, Array | None]:
        """Exact GELU: ``(x * cdf, saved)`` with ``cdf = (1 + erf(x / sqrt(2))) / 2``; ``saved`` is what
        ``gelu_exact_backward`` takes besides ``x``, opaque to the caller: here the cdf; the NumPy backend's
        derivative; None for a backend whose backward computes the derivative from ``x`` alone (the lazy CUDA
        and OpenCL backends), and where ``grad`` is false (no backward will follow). Generic default in
        primitives; backends finish it in place or in one kernel."""
        cdf = self._gelu_cdf(x)
        return self.mul(x, cdf), cdf if grad else None

    def _gelu_cdf(self, x: Array) -> Array:
        """``(1 + erf(x / sqrt(2))) / 2`` in primitives."""
        return self.mul(self.add(self.erf(self.mul(x, 1.0 / math.sqrt(2.0))), 1.0), 0.5)

    def gelu_exact_backward(self, g: Array, x: Array, cdf: Array | None) -> Array:
        """``g * (cdf + x * exp(-x*x/2) / sqrt(2*pi))``, the input gradient of ``gelu_exact`` (``cdf`` is the
        generic forward's ``saved``; computed again from ``x`` where it is None)."""
        if cdf is None:
            cdf = self._gelu_cdf(x)
        pdf = self.mul(self.exp(self.mul(self.mul(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
        return self.mul(g, self.add(cdf, self.mul(x, pdf)))

    def leaky_relu_backward(self, g: Array, y: Array, slope: float) -> Array:
        """``g * (1 where y > 0 else slope)``: the input gradient of a leaky ReLU with ``slope >= 0`` from its
        output ``y`` (positive exactly where the input was), ``g`` of ``y``'s dtype. Generic default in
        primitives (on CUDA and OpenCL a pending expression a neighbouring kernel computes)."""
        return self.mul(g, self.where(self.gt(y, 0), self.full((), 1.0, y.dtype), slope))

    def standardize(self, x: Array, axes: tuple[int, ...], eps: float, w: Array | None,
                    b: Array | None) -> tuple:
        """Normalization layers' forward: ``(y, mean, var, xhat, rstd)`` with ``xhat = (x - mean) * rstd`` over
        ``axes`` (biased variance), ``y = xhat * w + b``; ``mean``, ``var`` and ``rstd`` keep the reduced dims."""
        count = math.prod(x.shape[a] for a in axes)
        mean = self.mul(self.sum(x, axes, True), 1.0 / count)
        centred = self.sub(x, mean)
        var = self.mul(self.sum(self.mul(centred, centred), axes, True), 1.0 / count)
        rstd = self.reciprocal(self.sqrt(self.add(var, eps)))
        xhat = self.mul(centred, rstd)
        y = xhat
        if w is not None:
            y = self.mul(y, w)
        if b is not None:
            y = self.add(y, b)
        return y, mean, var, xhat, rstd

    def standardize_backward(self, g: Array, xhat: Array, rstd: Array, w: Array | None, axes: tuple[int, ...],
                             need_x: bool, w_shape: tuple[int, ...] | None,
                             b_shape: tuple[int, ...] | None) -> tuple:
        """The backward of ``standardize``: ``(gx, gw, gb)`` (None where not asked: ``need_x`` false,
        ``w_shape``/``b_shape`` None), ``gx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))`` with
        ``gy = g * w``, ``gw = sum_to(g * xhat, w_shape)``, ``gb = sum_to(g, b_shape)``."""
        count = math.prod(xhat.shape[a] for a in axes)
        if self._per_group(xhat.shape, axes, w, w_shape, b_shape):
            # The affine is constant over each reduced group (batch norm's per-channel weight): two reductions
            # serve all three gradients, sum(g) and sum(g * xhat), instead of four (mean(gy) and
            # mean(gy * xhat) are the weight times them; gb and gw are them).
            sg = self.sum(g, axes, True)
            sgx = self.sum(self.mul(g, xhat), axes, True)
            gx = None
            if need_x:
                mean_gy, mean_gyx = self.mul(sg, 1.0 / count), self.mul(sgx, 1.0 / count)
                gy = g
                if w is not None:
                    gy, mean_gy, mean_gyx = self.mul(g, w), self.mul(mean_gy, w), self.mul(mean_gyx, w)
                gx = self.mul(self.sub(self.sub(gy, mean_gy), self.mul(xhat, mean_gyx)), rstd)
            gw = None if w_shape is None else self._sum_to(sgx, w_shape)
            gb = None if b_shape is None else self._sum_to(sg, b_shape)
            return gx, gw, gb
        gx = gw = gb = None
        if need_x:
            gy = g if w is None else self.mul(g, w)
            mean_gy = self.mul(self.sum(gy, axes, True), 1.0 / count)
            mean_gyx = self.mul(self.sum(self.mul(gy, xhat), axes, True), 1.0 / count)
            gx = self.mul(self.sub(self.sub(gy, mean_gy), self.mul(xhat, mean_gyx)), rstd)
        if w_shape is not None:
            gw = self._sum_to(self.mul(g, xhat), w_shape)
        if b_shape is not None:
            gb = self._sum_to(g, b_shape)
        return gx, gw, gb

    @staticmethod
    def _per_group(shape: tuple[int, ...], axes: tuple[int, ...], w: Array | None, w_shape: tuple | None,
                   b_shape: tuple | None) -> bool:
        """Whether ``w`` and the asked ``w_shape``/``b_shape`` of ``standardize_backward`` are constant over
        each reduced group: every one (right-aligned with ``shape``) has size 1 on every axis in ``axes``."""
        ndim = len(shape)
        shapes = [tuple(s) for s in (None if w is None else w.shape, w_shape, b_shape) if s is not None]
        return bool(shapes) and all(
            len(s) <= ndim and all(s[a - ndim + len(s)] == 1 for a in axes if a >= ndim - len(s)) for s in shapes)

    def batch_norm(self, x: Array, weight: Array | None, bias: Array | None, eps: float,
                   running_mean: Array | None = None, running_var: Array | None = None,
                   momentum: float = 0.1, batches: Array | None = None) -> tuple:
        """Batch norm in training over ``x`` ``(N, C, *S)``: ``(y, mean, var, rstd)`` with ``y = (x - mean) *
        rstd * weight + bias`` per channel (``weight``/``bias`` ``(C,)`` in ``x``'s dtype, or None), the batch
        ``mean``, biased ``var`` and ``rstd = 1 / sqrt(var + eps)``, each ``(C,)``.

        ``running_mean``/``running_var`` (``(C,)``, or None) are updated in place as PyTorch does:
        ``r = (1 - momentum) * r + momentum * stat``, the variance unbiased (``count / (count - 1)``), and
        ``batches`` (the layer's ``num_batches_tracked``, a 0-d int64 array, or None) is incremented, by
        ``assign`` (``_count_batch``). Generic default: ``standardize`` over ``(0, 2, ...)`` and one ``assign``
        per buffer; CUDA and OpenCL run two kernels (rows' moments, then channels' statistics, the running
        update and the count) and leave ``y`` pending, to be computed by whatever reads it.
        """
        c = x.shape[1]
        view = (1, c) + (1,) * (len(x.shape) - 2)
        w, b = (None if t is None else self.reshape(t, view) for t in (weight, bias))
        axes = (0,) + tuple(range(2, len(x.shape)))
        y, mean, var, _, rstd = self.standardize(x, axes, eps, w, b)
        mean, var, rstd = (self.reshape(t, (c,)) for t in (mean, var, rstd))
        count = math.prod(x.shape[a] for a in axes)
        self._update_running(running_mean, running_var, mean, var, momentum, count / max(count - 1, 1))
        self._count_batch(batches)
        return y, mean, var, rstd

    def _count_batch(self, batches: Array | None) -> None:
        """``batch_norm``'s batch count (when given) incremented by one with ``assign``."""
        if batches is not None:
            self.assign(batches, self.add(batches, 1))

    def running_average(self, run: Array, stat: Array, momentum: float, scale: float = 1.0) -> Array:
        """``(1 - momentum) * run + momentum * scale * stat`` in ``run``'s dtype (``stat`` of ``run``'s shape):
        the update of a normalization layer's running statistic, for the caller to write into ``run``."""
        stat = stat if stat.dtype == run.dtype else self.cast(stat, run.dtype)
        return self.add(self.mul(run, 1.0 - momentum), self.mul(stat, momentum * scale))

    def _update_running(self, running_mean: Array | None, running_var: Array | None, mean: Array, var: Array,
                        momentum: float, unbias: float) -> None:
        """``batch_norm``'s running buffers (those given) updated in place by ``assign``, the variance unbiased."""
        for run, stat, scale in ((running_mean, mean, 1.0), (running_var, var, unbias)):
            if run is not None:
                self.assign(run, self.running_average(run, stat, momentum, scale))

    def batch_norm_backward(self, g: Array, x: Array, mean: Array, rstd: Array, weight: Array | None,
                            need_x: bool, need_w: bool, need_b: bool) -> tuple:
        """The gradients ``(gx, gw, gb)`` of ``batch_norm`` from the output gradient ``g``, the input ``x`` and
        the ``mean``/``rstd`` it returned (None where not asked; ``gw``/``gb`` ``(C,)``). Generic default:
        ``xhat`` again from ``x`` (as PyTorch keeps only the input and the statistics), then
        ``standardize_backward`` with its per-channel shortcut."""
        c = x.shape[1]
        view = (1, c) + (1,) * (len(x.shape) - 2)
        rstd = self.reshape(rstd, view)
        xhat = self.mul(self.sub(x, self.reshape(mean, view)), rstd)
        w = None if weight is None else self.reshape(weight, view)
        axes = (0,) + tuple(range(2, len(x.shape)))
        gx, gw, gb = self.standardize_backward(g, xhat, rstd, w, axes, need_x, view if need_w else None,
                                               view if need_b else None)
        return gx, *(None if t is None else self.reshape(t, (c,)) for t in (gw, gb))

    def bias_grad(self, g: Array) -> Array:
        """A linear layer's bias gradient: the 2-d ``g`` ``(rows, cols)`` summed over its rows, ``(cols,)``.

        The layer's GEMMs read ``g`` next, so a lazy backend (CUDA, OpenCL) computes a pending ``g`` (the
        activation's backward) in the summing kernel itself and keeps its values: ``g`` is realized after the
        call, and no kernel of its own ran for it. Generic default: ``sum(g, (0,))``.
        """
        return self.sum(g, (0,), False)

    def layer_norm(self, x: Array, weight: Array | None, bias: Array | None, eps: float,
                   residual: Array | None = None) -> tuple:
        """LayerNorm's forward over the rows of a 2-d ``x`` ``(rows, cols)``: ``(y, mean, rstd)`` with
        ``y = (x - mean) * rstd * weight + bias`` (``weight``/``bias`` ``(cols,)`` in ``x``'s dtype, or None),
        ``rstd = 1 / sqrt(var + eps)`` (biased variance) and ``mean``/``rstd`` of shape ``(rows,)``.
        With ``residual`` (``x``'s shape and dtype) ``y`` is ``residual + y``: a residual block ending in a
        LayerNorm (``FlowBuilder.also``), whose sum the CUDA and OpenCL kernels write in place of ``y``.

        16-bit inputs are normalised in float32, as PyTorch does: ``mean``/``rstd`` are float32 and ``y`` is
        rounded back once. Generic default: ``standardize`` over the columns (so a backend's ``standardize``
        serves here too); CUDA and OpenCL override it with one kernel (one work-group per row) for float32 and
        float64 and reach the 16-bit case through this default.
        """
        if residual is not None:
            y, mean, rstd = self.layer_norm(x, weight, bias, eps)
            return self.add(residual, y), mean, rstd
        if x.dtype.itemsize == 2 and x.dtype.kind in "fV":  # float16, bfloat16: compute in float32
            f32 = np.dtype(np.float32)
            w32, b32 = (None if t is None else self.cast(t, f32) for t in (weight, bias))
            y, mean, rstd = self.layer_norm(self.cast(x, f32), w32, b32, eps)
            return self.cast(y, x.dtype), mean, rstd
        y, mean, _, _, rstd = self.standardize(x, (1,), eps, weight, bias)
        rows = x.shape[0]
        return y, self.reshape(mean, (rows,)), self.reshape(rstd, (rows,))

    def layer_norm_backward(self, g: Array, x: Array, mean: Array, rstd: Array, weight: Array | None,
                            need_x: bool, need_w: bool, need_b: bool) -> tuple:
        """The gradients ``(gx, gw, gb)`` of ``layer_norm`` from its output gradient ``g`` ``(rows, cols)``, its
        input ``x``, and the ``mean``/``rstd`` it returned (None where not asked)::

            xhat = (x - mean) * rstd;  gy = g * weight
            gx = (gy - mean(gy) - xhat * mean(gy * xhat)) * rstd;  gw = sum_rows(g * xhat);  gb = sum_rows(g)

        Generic default: ``xhat`` again from ``x`` (nothing input-sized beyond ``x`` is kept from the forward,
        as in PyTorch), then ``standardize_backward``; 16-bit inputs in float32 as in the forward.
        """
        dtype = x.dtype
        if mean.dtype != dtype:  # a 16-bit input whose statistics are float32
            f32 = mean.dtype
            w32 = None if weight is None else self.cast(weight, f32)
            grads = self.layer_norm_backward(self.cast(g, f32), self.cast(x, f32), mean, rstd, w32, need_x,
                                             need_w, need_b)
            return tuple(None if a is None else self.cast(a, dtype) for a in grads)
        rows, cols = x.shape
        mean2, rstd2 = self.reshape(mean, (rows, 1)), self.reshape(rstd, (rows, 1))
        xhat = self.mul(self.sub(x, mean2), rstd2)
        return self.standardize_backward(g, xhat, rstd2, weight, (1,), need_x, (cols,) if need_w else None,
                                         (cols,) if need_b else None)

    def gru_cell(self, x: Array, p: Array, h: Array, bx: Array | None = None, bp: Array | None = None) -> tuple:
        """One GRU step's pointwise part (PyTorch's gates r, z, n) from the input projection ``x`` and the hidden
        projection ``p`` (both ``(B, 3H)``), their biases ``bx`` and ``bp`` (``(3H,)`` or None, added here as
        PyTorch's fused GRU cell adds them, so the projections are bias-free GEMMs) and the previous state ``h``
        ``(B, H)``, with ``X = x + bx`` and ``P = p + bp``::

            r, z = sigmoid(X[:, :2H] + P[:, :2H]);  n = tanh(X[:, 2H:] + r * P[:, 2H:]);  h' = n + z * (h - n)

        Returns ``(h', rz, n)`` with ``rz`` ``(B, 2H)`` and ``n`` ``(B, H)``, the values ``gru_cell_backward``
        reads. Generic default: the primitives above (a lazy backend fuses them); CUDA and OpenCL override it
        with one kernel (``row_kernels.gru_cell_forward``) for float32/float64 through ``_gru_kernel``."""
        found = self._gru_kernel(False, (x, p, h), (bx, bp))
        if found is not None:
            return found
        hidden = h.shape[-1]
        rows = slice(None)
        if bx is not None:
            x = self.add(x, bx)
        if bp is not None:
            p = self.add(p, bp)
        rz = self.reciprocal(self.add(self.exp(self.neg(self.add(self.slice(x, (rows, slice(0, 2 * hidden))),
                                                                 self.slice(p, (rows, slice(0, 2 * hidden)))))), 1.0))
        r, z = self.slice(rz, (rows, slice(0, hidden))), self.slice(rz, (rows, slice(hidden, 2 * hidden)))
        hn = self.slice(p, (rows, slice(2 * hidden, 3 * hidden)))
        n = self.tanh(self.add(self.slice(x, (rows, slice(2 * hidden, 3 * hidden))), self.mul(r, hn)))
        return self.add(n, self.mul(z, self.sub(h, n))), rz, n

    def gru_cell_backward(self, g: Array, rz: Array, n: Array, h: Array, p: Array, bp: Array | None = None) -> tuple:
        """The gradients ``(gx, gp, gh)`` of ``gru_cell`` from the output gradient ``g`` ``(B, H)``, the saved
        ``rz`` and ``n``, the previous state ``h``, the hidden projection ``p`` and its bias ``bp``
        (``hn = p[:, 2H:] + bp[2H:]``)::

            dn = g * (1 - z) * (1 - n * n);  dr = dn * hn * r * (1 - r);  dz = g * (h - n) * z * (1 - z)
            gx = [dr, dz, dn];  gp = [dr, dz, dn * r];  gh = g * z

        ``gx`` and ``gp`` are also the gradients of ``x + bx`` and ``p + bp``: the biases' gradients are their
        sums over the batch. Generic default: the primitives above; CUDA and OpenCL override it with one kernel
        (``row_kernels.gru_cell_backward``) for float32/float64 through ``_gru_kernel``."""
        found = self._gru_kernel(True, (g, rz, n, h, p), (bp,))
        if found is not None:
            return found
        hidden = h.shape[-1]
        rows = slice(None)
        r, z = self.slice(rz, (rows, slice(0, hidden))), self.slice(rz, (rows, slice(hidden, 2 * hidden)))
        hn = self.slice(p, (rows, slice(2 * hidden, 3 * hidden)))
        if bp is not None:
            hn = self.add(hn, self.slice(bp, (slice(2 * hidden, 3 * hidden),)))
        srz = self.mul(rz, self.add(self.neg(rz), 1.0))  # r(1-r) and z(1-z) in one pass
        dn = self.mul(self.mul(g, self.add(self.neg(z), 1.0)), self.add(self.neg(self.mul(n, n)), 1.0))
        dr = self.mul(self.mul(dn, hn), self.slice(srz, (rows, slice(0, hidden))))
        dz = self.mul(self.mul(g, self.sub(h, n)), self.slice(srz, (rows, slice(hidden, 2 * hidden))))
        return (self.concatenate([dr, dz, dn], 1), self.concatenate([dr, dz, self.mul(dn, r)], 1),
                self.mul(g, z))

    def _gru_kernel(self, backward: bool, arrays: tuple, biases: tuple) -> tuple | None:
        """The results of a backend's one-kernel GRU cell (forward, or ``backward``) over ``arrays`` in
        ``gru_cell``'s / ``gru_cell_backward``'s argument order and its ``biases`` (forward ``(bx, bp)``,
        backward ``(bp,)``, None where absent), or None where it has none for them (the primitives then run)."""
        return None

    def _sum_to(self, a: Array, shape: tuple[int, ...]) -> Array:
        """``a`` summed over the axes broadcasting ``shape`` to ``a.shape`` expanded, reshaped to ``shape``."""
        lead = len(a.shape) - len(shape)
        axes = tuple(i for i, n in enumerate(a.shape) if i < lead or (shape[i - lead] == 1 and n != 1))
        out = self.sum(a, axes, True) if axes else a
        return self.reshape(out, shape) if tuple(out.shape) != tuple(shape) else out

    def max_pool_blocks(self, a: Array, kernel: tuple[int, ...]) -> Array:
        """Max pooling of ``(N, C, *S)`` over non-overlapping windows that tile ``S`` (stride == kernel, every
        ``S[i]`` a multiple of ``kernel[i]``; the caller checks that), NaN propagating.

        Generic default: the pooling layer's window loop in primitives, one strided slice per kernel offset, a
        piece replacing the running maximum where it is greater or NaN (the first maximum wins, the last NaN)."""
        best = None
        for piece in self._block_pieces(a, kernel):
            if best is None:
                best = self.add(piece, 0)
            else:
                best = self.where(self.logical_or(self.gt(piece, best), self.isnan(piece)), piece, best)
        return best

    def max_pool_blocks_backward(self, a: Array, best: Array, g: Array, kernel: tuple[int, ...]) -> Array:
        """The input gradient of ``max_pool_blocks``: each block's gradient ``g`` goes to its first maximum in
        row-major order (to its last NaN where it has one), zeros elsewhere.

        Generic default: the forward's loop again, keeping each block's winning offset, then one write per
        offset into a zero buffer (the pooling layer's window backward, with ``best`` not needed)."""
        running, where_k = None, None
        for k, piece in enumerate(self._block_pieces(a, kernel)):
            if running is None:
                running = self.add(piece, 0)
                where_k = self.full(tuple(running.shape), 0, np.dtype(np.int64))
                continue
            better = self.logical_or(self.gt(piece, running), self.isnan(piece))
            running = self.where(better, piece, running)
            where_k = self.where(better, self.full((), k, np.dtype(np.int64)), where_k)
        gx = self.full(tuple(a.shape), 0, g.dtype)
        zero = self.full((), 0, g.dtype)
        for k, index in enumerate(self._block_slices(tuple(a.shape), kernel)):
            view = self.slice(gx, index)
            picked = self.where(self.eq(where_k, self.full((), k, np.dtype(np.int64))), g, zero)
            self.assign(view, self.add(view, picked))
        return gx

    def conv_gemm(self, x: Array, w: Array, kernel: tuple[int, ...], stride: tuple[int, ...],
                  dilation: tuple[int, ...], out: tuple[int, ...],
                  padding: tuple[tuple[int, int], ...] | None = None) -> Array:
        """A convolution in the batch-last layout: ``x`` ``(C_in, *S, N)``, ``w`` ``(C_out, C_in * K)`` with
        ``K = prod(kernel)`` (kernel offsets row-major, innermost), the result ``(C_out, *out, N)``; ``padding``
        (one ``(low, high)`` per spatial dim, or None) is the zero padding of ``x`` that ``out`` counts.

        Generic default: ``x`` padded, then im2col, one strided slice per kernel offset stacked into
        ``(C_in, K, *out, N)`` = ``(C_in * K, L * N)``, then one GEMM. Backends override it to avoid the whole
        im2col buffer and the padded copy."""
        if padding is not None:
            x = self.pad(x, [(0, 0), *padding, (0, 0)], 0.0)
        return self.reshape(self.matmul(w, self._conv_cols(x, kernel, stride, dilation, out, 0, out[0])),
                            (w.shape[0],) + tuple(out) + (x.shape[-1],))

    def conv_gemm_backward(self, x: Array, w: Array, g: Array, kernel: tuple[int, ...], stride: tuple[int, ...],
                           dilation: tuple[int, ...], need_x: bool, need_w: bool,
                           padding: tuple[tuple[int, int], ...] | None = None) -> tuple:
        """The gradients ``(gx, gw)`` of ``conv_gemm`` from its inputs and the output gradient ``g``
        ``(C_out, *out, N)`` (None where not asked): ``gw = g @ cols^T`` with the im2col ``cols`` built again
        from ``x`` (nothing convolution-sized is kept from the forward, as in PyTorch), and ``gx`` the col2im
        of ``w^T @ g`` (each kernel offset's rows added into its strided slice of zeros shaped like the padded
        ``x``), of ``x``'s shape (the padding's rows dropped).

        Generic default: ``x`` padded, then the whole ``cols`` and ``w^T @ g`` at once, in primitives."""
        if padding is not None:
            xp = self.pad(x, [(0, 0), *padding, (0, 0)], 0.0)
            gx, gw = self.conv_gemm_backward(xp, w, g, kernel, stride, dilation, need_x, need_w)
            return (None if gx is None else self.slice(gx, self._unpadded_part(x.shape, padding))), gw
        out = tuple(g.shape[1:-1])
        g2 = self.reshape(g, (g.shape[0], -1))
        gw = gx = None
        if need_w:
            cols = self._conv_cols(x, kernel, stride, dilation, out, 0, out[0])
            gw = self.matmul(g2, self.permute(cols, (1, 0)))
        if need_x:
            gx = self.conv_gemm_transpose(g, w, kernel, stride, dilation, tuple(x.shape))
        return gx, gw

    @staticmethod
    def _unpadded_part(shape: tuple, padding: tuple) -> tuple[slice, ...]:
        """The index of the unpadded ``shape`` ``(C, *S, N)`` inside its zero-padded array (``padding``: one
        ``(low, high)`` per spatial dim): ``conv_gemm_backward``'s input gradient, folded into the padded shape."""
        return (slice(None),) + tuple(slice(lo, lo + n) for (lo, _), n in zip(padding, shape[1:-1])) + (slice(None),)

    def conv_gemm_transpose(self, g: Array, w: Array, kernel: tuple[int, ...], stride: tuple[int, ...],
                            dilation: tuple[int, ...], x_shape: tuple[int, ...],
                            crop: tuple[tuple[int, int], ...] | None = None) -> Array:
        """The adjoint of ``conv_gemm`` in its input: the col2im of ``w^T @ g`` into zeros of ``x_shape``
        ``(C_in, *S, N)``, for ``g`` ``(C_out, *out, N)`` (the input gradient of a convolution, and the forward of
        a transposed convolution, whose weight is then ``(C_in_of_transposed, C_out * K)``). With ``crop`` (one
        ``(low, high)`` per spatial dim, what a transposed convolution's ``padding`` takes off its output) the
        result is that part of it: ``(C_in, *(S - low - high), N)``.

        Generic default: the whole ``w^T @ g`` at once, then one strided add per kernel offset; the crop a view.
        """
        out = tuple(g.shape[1:-1])
        gx = self.full(tuple(x_shape), 0, g.dtype)
        g2 = self.reshape(g, (g.shape[0], -1))
        self._conv_fold(gx, self.matmul(self.permute(w, (1, 0)), g2), kernel, stride, dilation, out, 0, out[0])
        if crop is None:
            return gx
        return self.slice(gx, self._cropped_part(x_shape, crop))

    @staticmethod
    def _cropped_part(shape: tuple, crop: tuple) -> tuple[slice, ...]:
        """The index of what ``crop`` (one ``(low, high)`` per spatial dim) leaves of a ``(C, *S, N)`` array."""
        return (slice(None),) + tuple(slice(lo, n - hi) for (lo, hi), n in zip(crop, shape[1:-1])) + (slice(None),)

    # ------------------------------------------------------- native convolutions (optional capability)
    def native_conv(self, dtype: np.dtype, nd: int) -> bool:
        """Whether this backend runs ``nd``-d convolutions of ``dtype`` itself, through ``conv_forward``,
        ``conv_input_grad`` and ``conv_weight_grad`` (cuDNN on CUDA, implicit-GEMM kernels on OpenCL).

        False here: the ``nn`` layer then builds convolutions from the im2col composites above. A backend that
        says True must implement all three for every stride, dilation, symmetric zero padding and group count.
        """
        return False

    def conv_forward(self, x: Array, w: Array, stride: tuple[int, ...], padding: tuple[int, ...],
                     dilation: tuple[int, ...], groups: int) -> Array:
        """A convolution in PyTorch's layout: ``x`` ``(N, C_in, *S)``, ``w`` ``(C_out, C_in / groups, *K)``,
        zero ``padding`` on both sides of each spatial dim, the result ``(N, C_out, *out)`` with
        ``out[i] = (S[i] + 2 * padding[i] - dilation[i] * (K[i] - 1) - 1) // stride[i] + 1``.
        Only called where ``native_conv`` says True.

        Generic default (a backend's fallback where its native library refuses a problem): the batch-last
        ``conv_gemm`` composite, one GEMM per group."""
        nd = x.ndim - 2
        xl = self._conv_batch_last(x, padding)
        kernel, c_out = tuple(w.shape[2:]), w.shape[0]
        out = tuple((s - d * (k - 1) - 1) // st + 1
                    for s, k, st, d in zip(xl.shape[1:-1], kernel, stride, dilation))
        cg, og = x.shape[1] // groups, c_out // groups
        pieces = [self.conv_gemm(self.slice(xl, (slice(i * cg, (i + 1) * cg),)),
                                 self.reshape(self.slice(w, (slice(i * og, (i + 1) * og),)), (og, -1)),
                                 kernel, tuple(stride), tuple(dilation), out) for i in range(groups)]
        y = pieces[0] if groups == 1 else self.concatenate(pieces, 0)  # (C_out, *out, N)
        return self.contiguous(self.permute(y, (nd + 1, 0) + tuple(range(1, nd + 1))))

    def conv_forward_bias(self, x: Array, w: Array, b: Array, stride: tuple[int, ...], padding: tuple[int, ...],
                          dilation: tuple[int, ...], groups: int) -> Array:
        """``conv_forward`` with ``b`` (``(C_out,)``, ``x``'s dtype) added to each output channel: a biased
        convolution layer's forward. Only called where ``native_conv`` says True.

        Generic default: ``conv_forward``, then the bias broadcast and added (on the lazy backends a pending
        add that the kernel reading the result computes). CUDA runs both as one cuDNN graph (``conv_fprop``
        then ``bias``), no separate pass over the output."""
        y = self.conv_forward(x, w, stride, padding, dilation, groups)
        return self.add(y, self.reshape(b, (1, w.shape[0]) + (1,) * (x.ndim - 2)))

    # ------------------------------------------------------- fused attention (optional capability)
    def native_sdpa(self, dtype: np.dtype, head_dim: int) -> bool:
        """Whether this backend runs scaled dot-product attention of ``dtype`` as one fused kernel forward and
        one backward (``sdpa_forward`` / ``sdpa_backward``: cuDNN's flash attention on CUDA), keeping O(L)
        memory instead of the ``L x S`` weights. False here: the ``nn`` layer composes matmul and softmax."""
        return False

    #: Whether ``sdpa_forward`` / ``sdpa_backward`` take strided (permuted) 4-d inputs as they are; False makes
    #: ``F.scaled_dot_product_attention`` pass contiguous copies (the fused kernels read dense rows).
    sdpa_strided_inputs = False

    def sdpa_forward(self, q: Array, k: Array, v: Array, scale: float, causal: bool) -> tuple[Array, Array]:
        """``softmax(q k^T * scale) v`` for ``q`` ``(B, H, L, D)``, ``k`` ``(B, H, S, D)``, ``v``
        ``(B, H, S, Dv)``, with a causal mask (key ``j`` hidden from query ``i`` where ``j > i``) when
        ``causal``; returns ``(out, stats)`` where ``stats`` ``(B, H, L, 1)`` float32 is each row's
        log-sum-exp of the scaled scores, all the backward needs besides the inputs and ``out``.

        Generic default, in primitives (the reference the fused kernels are tested against; it does hold the
        ``L x S`` scores while it runs)."""
        f32 = np.dtype(np.float32)
        scores = self.mul(self.matmul(self.cast(q, f32), self.permute(self.cast(k, f32), (0, 1, 3, 2))),
                          self.full((), scale, f32))
        if causal:
            scores = self.add(scores, self._causal_bias(q.shape[2], k.shape[2]))
        top = self.max(scores, (3,), True)
        p = self.exp(self.sub(scores, top))
        total = self.sum(p, (3,), True)
        out = self.matmul(self.div(p, total), self.cast(v, f32))
        return self.cast(out, q.dtype), self.add(top, self.log(total))

    def sdpa_backward(self, q: Array, k: Array, v: Array, out: Array, dout: Array, stats: Array, scale: float,
                      causal: bool) -> tuple[Array, Array, Array]:
        """The gradients ``(dq, dk, dv)`` of ``sdpa_forward`` from its output, ``stats`` and the output
        gradient. Generic default, in primitives: the weights rebuilt from ``stats``, then
        ``dv = P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``, ``dq = dS K * scale``, ``dk = dS^T Q * scale``."""
        f32 = np.dtype(np.float32)
        q32, k32, v32 = self.cast(q, f32), self.cast(k, f32), self.cast(v, f32)
        do32, o32 = self.cast(dout, f32), self.cast(out, f32)
        scores = self.mul(self.matmul(q32, self.permute(k32, (0, 1, 3, 2))), self.full((), scale, f32))
        if causal:
            scores = self.add(scores, self._causal_bias(q.shape[2], k.shape[2]))
        p = self.exp(self.sub(scores, stats))
        dv = self.matmul(self.permute(p, (0, 1, 3, 2)), do32)
        dp = self.matmul(do32, self.permute(v32, (0, 1, 3, 2)))
        ds = self.mul(p, self.sub(dp, self.sum(self.mul(do32, o32), (3,), True)))
        ds = self.mul(ds, self.full((), scale, f32))
        dq = self.matmul(ds, k32)
        dk = self.matmul(self.permute(ds, (0, 1, 3, 2)), q32)
        return self.cast(dq, q.dtype), self.cast(dk, k.dtype), self.cast(dv, v.dtype)

    def _causal_bias(self, length: int, keys: int) -> Array:
        """``(L, S)`` float32: 0 where key ``j <= i``, -inf above the diagonal (aligned top-left)."""
        f32 = np.dtype(np.float32)
        rows = self.reshape(self.arange(0, length, 1, np.dtype(np.int64)), (length, 1))
        cols = self.reshape(self.arange(0, keys, 1, np.dtype(np.int64)), (1, keys))
        return self.where(self.le(cols, rows), self.full((), 0.0, f32), self.full((), float("-inf"), f32))

    def _conv_batch_last(self, x: Array, padding: Sequence[int]) -> Array:
        """``(N, C, *S)`` to the zero-padded batch-last ``(C, *S_padded, N)`` of ``conv_gemm``."""
        nd = x.ndim - 2
        xl = self.permute(x, (1,) + tuple(range(2, nd + 2)) + (0,))
        if any(padding):
            xl = self.pad(xl, [(0, 0)] + [(p, p) for p in padding] + [(0, 0)], 0.0)
        return xl

    def conv_input_grad(self, g: Array, w: Array, x_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Array:
        """The adjoint of ``conv_forward`` in its input (cuDNN's dgrad, also a transposed convolution's
        forward): ``g`` ``(N, C_out, *out)`` and ``w`` to an array of ``x_shape``. Only called where
        ``native_conv`` says True. Generic default: ``conv_gemm_transpose`` per group, then the padding cropped."""
        nd = g.ndim - 2
        kernel, c_in = tuple(w.shape[2:]), x_shape[1]
        gl = self.permute(g, (1,) + tuple(range(2, nd + 2)) + (0,))  # (C_out, *out, N)
        cg, og = c_in // groups, g.shape[1] // groups
        padded = tuple(s + 2 * p for s, p in zip(x_shape[2:], padding))
        pieces = [self.conv_gemm_transpose(self.slice(gl, (slice(i * og, (i + 1) * og),)),
                                           self.reshape(self.slice(w, (slice(i * og, (i + 1) * og),)), (og, -1)),
                                           kernel, tuple(stride), tuple(dilation), (cg,) + padded + (x_shape[0],))
                  for i in range(groups)]
        gx = pieces[0] if groups == 1 else self.concatenate(pieces, 0)  # (C_in, *padded, N)
        if any(padding):
            gx = self.slice(gx, (slice(None),) + tuple(slice(p, p + s) for p, s in zip(padding, x_shape[2:])))
        return self.contiguous(self.permute(gx, (nd + 1, 0) + tuple(range(1, nd + 1))))

    def conv_weight_grad(self, x: Array, g: Array, w_shape: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Array:
        """The adjoint of ``conv_forward`` in its weight (cuDNN's wgrad): ``x`` ``(N, C_in, *S)`` and ``g``
        ``(N, C_out, *out)`` to an array of ``w_shape``. Only called where ``native_conv`` says True.
        Generic default: ``conv_gemm_backward`` per group (its weight gradient only)."""
        nd = x.ndim - 2
        kernel, c_out = tuple(w_shape[2:]), w_shape[0]
        xl = self._conv_batch_last(x, padding)
        gl = self.permute(g, (1,) + tuple(range(2, nd + 2)) + (0,))
        cg, og = x.shape[1] // groups, c_out // groups
        shape = (og, cg * math.prod(kernel))
        pieces = [self.conv_gemm_backward(self.slice(xl, (slice(i * cg, (i + 1) * cg),)),
                                          self.full(shape, 0, g.dtype), self.slice(gl, (slice(i * og, (i + 1) * og),)),
                                          kernel, tuple(stride), tuple(dilation), False, True)[1]
                  for i in range(groups)]
        gw = pieces[0] if groups == 1 else self.concatenate(pieces, 0)
        return self.reshape(gw, tuple(w_shape))

    def conv_gemm_transpose_backward(self, x: Array, w: Array, g: Array, kernel: tuple[int, ...],
                                     stride: tuple[int, ...], dilation: tuple[int, ...], need_x: bool,
                                     need_w: bool, padding: tuple[tuple[int, int], ...] | None = None) -> tuple:
        """The gradients ``(gx, gw)`` of ``conv_gemm_transpose(x, w, ...)`` (a transposed convolution's input
        ``x`` ``(C_in, *in, N)`` and weight ``w`` ``(C_in, C_out * K)``) from its output gradient ``g``
        ``(C_out, *full, N)``, None where not asked: ``gx = conv_gemm(g, w)`` and ``gw = x @ cols(g)^T``, both
        reading the im2col of ``g``. With ``padding`` (one ``(low, high)`` per spatial dim: the forward's
        ``crop``) ``g`` is the gradient of the cropped output, zero-padded back to ``full`` by the im2col.

        Generic default: ``conv_gemm`` and ``conv_gemm_backward``'s weight gradient, each building that im2col;
        backends override it to build it once."""
        in_size = tuple(x.shape[1:-1])
        gx = self.conv_gemm(g, w, kernel, stride, dilation, in_size, padding) if need_x else None
        gw = self.conv_gemm_backward(g, w, x, kernel, stride, dilation, False, True, padding)[1] if need_w else None
        return gx, gw

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def _conv_offsets(x_shape: tuple, kernel: tuple, stride: tuple, dilation: tuple, out: tuple, r0: int,
                      r1: int) -> tuple[tuple[slice, ...], ...]:
        """Per kernel offset, the slice of a batch-last ``x`` feeding output rows ``r0:r1`` (first spatial dim).

        Cached: a training step asks for the same few hundred index lists every step, and building them in
        Python cost dcgan_d 2.2 ms per step (one call per row block and convolution pass)."""
        index = []
        for off in itertools.product(*(range(k) for k in kernel)):
            starts = [o * d for o, d in zip(off, dilation)]
            starts[0] += r0 * stride[0]
            sizes = (r1 - r0,) + tuple(out[1:])
            spatial = tuple(slice(b, b + (n - 1) * s + 1, s) for b, n, s in zip(starts, sizes, stride))
            index.append((slice(None),) + spatial + (slice(None),))
        return tuple(index)

    def _conv_cols(self, x: Array, kernel: tuple, stride: tuple, dilation: tuple, out: tuple, r0: int,
                   r1: int) -> Array:
        """The im2col of output rows ``r0:r1``: ``(C_in * K, (r1 - r0) * prod(out[1:]) * N)``."""
        c, n = x.shape[0], x.shape[-1]
        piece = (c, 1, r1 - r0) + tuple(out[1:]) + (n,)
        pieces = [self.reshape(self.slice(x, ix), piece)
                  for ix in self._conv_offsets(tuple(x.shape), kernel, stride, dilation, out, r0, r1)]
        cols = pieces[0] if len(pieces) == 1 else self.concatenate(pieces, 1)
        return self.reshape(cols, (c * len(pieces), -1))

    def _conv_fold(self, gx: Array, gcols: Array, kernel: tuple, stride: tuple, dilation: tuple, out: tuple,
                   r0: int, r1: int) -> None:
        """col2im of output rows ``r0:r1``: ``gcols`` ``(C_in * K, ...)`` added into ``gx`` in place."""
        c, n = gx.shape[0], gx.shape[-1]
        k = math.prod(kernel)
        blocks = self.reshape(gcols, (c, k, r1 - r0) + tuple(out[1:]) + (n,))
        for j, ix in enumerate(self._conv_offsets(tuple(gx.shape), kernel, stride, dilation, out, r0, r1)):
            view = self.slice(gx, ix)
            piece = self.reshape(self.slice(blocks, (slice(None), slice(j, j + 1))), tuple(view.shape))
            self.assign(view, self.add(view, piece))

    @staticmethod
    def _block_slices(shape: tuple[int, ...], kernel: tuple[int, ...]) -> list[tuple[slice, ...]]:
        """One slice tuple per kernel offset (row-major order) picking that offset of every block of ``shape``."""
        out = tuple(n // k for n, k in zip(shape[2:], kernel))
        return [(slice(None), slice(None))
                + tuple(slice(o, o + (n - 1) * k + 1, k) for o, n, k in zip(off, out, kernel))
                for off in itertools.product(*(range(k) for k in kernel))]

    def _block_pieces(self, a: Array, kernel: tuple[int, ...]) -> list[Array]:
        """``a``'s strided views at each kernel offset (see ``_block_slices``)."""
        return [self.slice(a, index) for index in self._block_slices(tuple(a.shape), kernel)]

    def adam_step(self, p: Array, g: Array, m: Array, v: Array, beta1: float, beta2: float, step_size: Any,
                  eps_hat: Any, l2: float = 0.0, decay: Any = 1.0, maximize: bool = False,
                  v_max: Array | None = None) -> tuple[Array, Array, Array, Array | None]:
        """One Adam/AdamW update of ``p``, ``m``, ``v`` (and ``v_max`` with AMSGrad) in place::

            g = -g if maximize else g;  g = g + l2 * p
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g;   v_max = max(v_max, v)    (AMSGrad: v_max given)
            p = p * decay - step_size * m / (sqrt(v_max or v) + eps_hat)

        ``step_size``, ``eps_hat`` and ``decay`` (AdamW's ``1 - lr * wd``) are host numbers or, inside
        ``fg.capture``, 0-d device arrays; ``g`` is used in ``p``'s dtype. Returns ``(p, m, v, v_max)``: the
        arrays now holding the new values, as ``assign`` returns them (the inputs themselves where written in
        place). Generic default: the optimizer's tensor-op update in primitives, operation for operation; the
        backends override it with one kernel (CUDA, OpenCL) or chunked in-place passes (NumPy).
        """
        dtype = p.dtype
        g = g if g.dtype == dtype else self.cast(g, dtype)
        if maximize:
            g = self.neg(g)
        if l2:
            g = self.add(g, self.mul(p, self._step_scalar(l2, dtype)))
        p_base = p if _is_host_number(decay) and decay == 1.0 else self.mul(p, self._step_scalar(decay, dtype))
        m = self.assign(m, self.add(self.mul(m, self._step_scalar(beta1, dtype)),
                                    self.mul(g, self._step_scalar(1 - beta1, dtype))))
        v = self.assign(v, self.add(self.mul(v, self._step_scalar(beta2, dtype)),
                                    self.mul(self.mul(g, self._step_scalar(1 - beta2, dtype)), g)))
        second = v
        if v_max is not None:
            v_max = second = self.assign(v_max, self.maximum(v_max, v))
        update = self.div(self.mul(m, self._step_scalar(step_size, dtype)),
                          self.add(self.sqrt(second), self._step_scalar(eps_hat, dtype)))
        return self.assign(p, self.sub(p_base, update)), m, v, v_max

    def adam_step_multi(self, params: Sequence[Array], grads: Sequence[Array], ms: Sequence[Array],
                        vs: Sequence[Array], beta1: float, beta2: float, step_size: Any, eps_hat: Any,
                        l2: float = 0.0, decay: Any = 1.0, maximize: bool = False,
                        v_maxs: Sequence[Array] | None = None) -> tuple[list, list, list, list | None]:
        """``adam_step`` on many parameters with the same scalars (one optimizer group's tensors of one dtype):
        ``(params, ms, vs, v_maxs)`` as lists of the arrays now holding the new values.

        Every tensor gets exactly what ``adam_step`` would give it (bit for bit). Generic default: a loop over
        ``adam_step``; CUDA updates them in one launch over a device table of pointers, OpenCL in one launch
        per 8 tensors.
        """
        out_p, out_m, out_v, out_vmax = [], [], [], []
        for i, (p, g, m, v) in enumerate(zip(params, grads, ms, vs)):
            p, m, v, v_max = self.adam_step(p, g, m, v, beta1, beta2, step_size, eps_hat, l2, decay, maximize,
                                            None if v_maxs is None else v_maxs[i])
            out_p.append(p)
            out_m.append(m)
            out_v.append(v)
            out_vmax.append(v_max)
        return out_p, out_m, out_v, None if v_maxs is None else out_vmax

    def sgd_step(self, p: Array, g: Array, buf: Array | None, lr: Any, momentum: float, dampening: float,
                 weight_decay: float, nesterov: bool, maximize: bool) -> tuple[Array, Array | None]:
        """One SGD update of ``p`` (and of the momentum buffer ``buf``) in place, PyTorch's formula::

            g = -g if maximize else g;  g = g + weight_decay * p
            buf = copy of g (first step: buf None)   or   buf = momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf                (only with momentum != 0)
            p = p - lr * g

        ``lr`` is a host number or, inside ``fg.capture``, a 0-d device array; ``g`` is used in ``p``'s dtype.
        Returns ``(p, buf)``: the arrays now holding the new values (the inputs themselves where written in
        place; a new buffer on the first momentum step, None without momentum). Generic default: the
        optimizer's tensor-op update in primitives; CUDA and OpenCL run a momentum step in one kernel.
        """
        dtype = p.dtype
        g = g if g.dtype == dtype else self.cast(g, dtype)
        if maximize:
            g = self.neg(g)
        if weight_decay != 0:
            g = self.add(g, self.mul(p, self._step_scalar(weight_decay, dtype)))
        if momentum != 0:
            if buf is None:  # a copy with its own storage, as ``Tensor.clone`` makes it
                buf = self.contiguous(g)
                if buf is g:
                    buf = self.contiguous(self.add(g, 0))
            else:
                damped = g if dampening == 0 else self.mul(g, self._step_scalar(1 - dampening, dtype))
                buf = self.assign(buf, self.add(self.mul(buf, self._step_scalar(momentum, dtype)), damped))
            g = self.add(g, self.mul(buf, self._step_scalar(momentum, dtype))) if nesterov else buf
        return self.assign(p, self.sub(p, self.mul(g, self._step_scalar(lr, dtype)))), buf

    def _step_scalar(self, x: Any, dtype: np.dtype) -> Any:
        """An optimizer scalar as the tensor layer passes it next to a ``dtype`` array: a host number as is (a
        0-d array for bfloat16, which NumPy would otherwise compute in float32), a 0-d device array cast."""
        if _is_host_number(x):
            return x if dtype.kind == "f" else self.full((), x, dtype)
        return x if x.dtype == dtype else self.cast(x, dtype)

    #: Whether ``graph_session`` captures steps as device graphs (CUDA graphs); ``fg.capture`` runs eagerly where not.
    supports_graph_capture = False

    def graph_session(self) -> Any:
        """A device-graph capture session for ``fg.capture`` (see ``runtime.py``), on backends whose
        ``supports_graph_capture`` is True; the default raises a BackendError (``fg.capture`` checks the flag
        and runs the step eagerly instead)."""
        raise BackendError(f"the {self.name} backend has no device graphs (supports_graph_capture is False); "
                           "run the step eagerly")

    def native(self, a: Array) -> Any:
        """The array as the backend's array library sees it (a CuPy array for a fused lazy one), for
        collectives that hand it to another library; the default is the array itself."""
        return a

    #: Whether ``from_dlpack``/``to_dlpack``/``dlpack_device`` exchange arrays zero-copy (NumPy, CuPy); the
    #: defaults raise a BackendError naming the backend.
    supports_dlpack = False

    def from_dlpack(self, obj: Any) -> Array:
        """Zero-copy import of a DLPack-capable array on this device (``fg.from_dlpack``)."""
        raise BackendError(f"the {self.name} backend cannot import DLPack; copy through the host (fg.tensor(...))")

    def to_dlpack(self, a: Array, *args: Any, **kwargs: Any) -> Any:
        """A DLPack capsule for ``a`` (``Tensor.__dlpack__``)."""
        raise BackendError(f"the {self.name} backend cannot export DLPack; copy to 'cpu' first")

    def dlpack_device(self, a: Array) -> tuple[int, int]:
        """``(device_type, index)`` for ``Tensor.__dlpack_device__``."""
        raise BackendError(f"the {self.name} backend has no DLPack device; copy to 'cpu' first")

    # ----------------------------------------------------------------- runtime
    def host_call(self, fn: Any, *arrays: Array, sink: bool = False) -> Any:
        """Host work on device arrays as one unit: ``fn(*arrays)``, returning arrays (or None).

        A store collective or a metric read goes through here, so ``fg.jit`` records it as one call and runs
        it again, on the replay's arrays, every time the step replays (host reads inside ``fn`` are its own
        business). ``sink=True`` says ``fn`` returns nothing the step uses (a metric read): a backend recording
        a device graph then runs it after each launch on copies of ``arrays`` made inside the graph; other
        host work is refused there (a graph cannot run Python).
        """
        return fn(*arrays)

    def synchronize(self) -> None:
        """Wait for all queued work on the device."""

    #: A layout hint for ``nn`` convolutions: True asks for the batch-last im2col layout ``(C, *S, N)``
    #: (faster with NumPy), False (default) for ``(C, N, *S)`` (faster on the GPU backends, as measured).
    conv_batch_last = False

    def memory_stats(self) -> dict[str, int]:
        """Device memory figures in bytes where the backend tracks them (``allocated``, ``peak``, ``total``)."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device}>"


def _is_host_number(x: Any) -> bool:
    """A Python/NumPy number (as opposed to a 0-d device array holding a step scalar inside ``fg.capture``)."""
    return isinstance(x, (int, float, np.generic))


def _declare_elementwise() -> None:
    """Give the abstract class one documented stub per elementwise/reduction primitive."""

    def unary_stub(name: str):
        def op(self: Backend, a: Array) -> Array:
            raise _missing(self, name)

        op.__name__ = name
        op.__doc__ = f"Elementwise ``{name}(a)``."
        return op

    def binary_stub(name: str):
        def op(self: Backend, a: Array, b: Array) -> Array:
            raise _missing(self, name)

        op.__name__ = name
        op.__doc__ = f"Elementwise ``{name}(a, b)`` with broadcasting."
        return op

    def reduce_stub(name: str):
        def op(self: Backend, a: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
            raise _missing(self, name)

        op.__name__ = name
        op.__doc__ = f"``{name}`` over ``axes`` (a tuple; empty means no reduction)."
        return op

    for n in UNARY_OPS:
        setattr(Backend, n, unary_stub(n))
    for n in BINARY_OPS:
        setattr(Backend, n, binary_stub(n))
    for n in REDUCE_OPS:
        setattr(Backend, n, reduce_stub(n))


_declare_elementwise()
