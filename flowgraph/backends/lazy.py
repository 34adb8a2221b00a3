"""The lazy engine shared by the device backends (CUDA, OpenCL): deferred elementwise work, hazards, realization.

Elementwise primitives, ``where`` and ``cast`` do not run: they return an array of the backend's lazy type
holding an :class:`~flowgraph.backends.fusion.Expr` over its inputs. A chain runs as one generated kernel when
something needs its values: any other primitive, a host read, a write to a buffer it reads, or the size caps
of :mod:`~flowgraph.backends.fusion`. This module owns everything about that which does not depend on the
device:

* **Building** (:meth:`LazyEngine._node`): broadcasting (a realized input becomes a broadcast view, a small
  pending one is re-expressed over broadcast views of its leaves, so ``(x - mean) * rstd`` stays one kernel),
  operand checks, the size caps.
* **Keys** (:func:`flatten`): the structural key, leaves and scalars of a tree in one memoized walk, the order
  :func:`~flowgraph.backends.fusion.linearize` uses; kernels are cached by that key and the full program is
  built only when a kernel is compiled.
* **Hazards**: a pending node registers under the allocations of its realized inputs and as a *consumer* of
  its pending ones; a realized node hands its consumers on to its new allocation. Before an allocation is
  overwritten (:meth:`LazyEngine.assign`, fused optimizer steps) the pending readers of it run first.
* **Realization** (:meth:`LazyEngine.realize`) and **writes** (:meth:`LazyEngine._write`: a pending source runs
  straight into the destination view; one that reads the destination in another layout is staged first).
* **Values needed again** (:func:`extra_outputs`): the kernel that runs a tree also writes out its interior
  values that autograd saved for backward (:meth:`LazyEngine.mark_saved`) or that another pending tree reads,
  so backward and the other tree read them instead of recomputing them (multi-output fused kernels).

A backend mixes :class:`LazyEngine` in and supplies only storage and kernels: the hooks listed on the class.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BackendError, ShapeError
from . import fusion
from . import row_kernels as R
from .fusion import Expr, Scalar, linearize, result_dtype

#: Python and NumPy scalar types a primitive takes in place of an array.
SCALAR_TYPES = (bool, int, float, np.generic)
_BOOL = np.dtype(bool)
_I64 = np.dtype(np.int64)

#: A pending input broadcast to a larger shape is re-expressed over broadcast views of its leaves (recomputed
#: per output element, no kernel of its own) up to this many nodes; a larger one is realized first.
BROADCAST_RECOMPUTE_NODES = 8

#: A row kernel computes a pending input itself (``LazyEngine._row_input``) when its expression reads at most
#: this many arrays (each one a kernel argument with its offset and strides).
ROW_INPUT_LEAVES = 8
#: ... and its program passes ``_row_computable``, remembered per program for up to this many programs.
ROW_PROGRAMS = 4096

#: Reader lists of an allocation drop the readers that were realized or freed each time they grow by this many.
PRUNE_READERS = 64

#: The registry of reader lists drops the entries of freed allocations when it holds more than twice its live
#: entries, and at least this many: amortised one liveness test per entry added, and the weak references of
#: an eager step's activations die within the step instead of ageing into the collector's oldest generation
#: (at 4096, about 150 references a step of gru_seq reached it and brought on its 80-110 ms full collections
#: sooner; docs/cuda.md, "Python's garbage collector and eager steps").
READER_ENTRIES = 64
_ref = weakref.ref
_deref = weakref.ref.__call__
_is = operator.is_
_NONES = itertools.repeat(None)
_dtype_of = operator.attrgetter("dtype")


class LazyArrayBase:
    """What the lazy engine's array types share (CUDA's ``LazyArray``, OpenCL's ``CLArray``): the shape queries
    the layers above read, ``ndim``, ``size`` and ``len()``, from ``shape``. A backend's array class adds its
    storage and the engine's fields (``lazy``, ``shape``, ``dtype``, ``consumers``)."""

    __slots__ = ()
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of a 0-d {type(self).__name__}")
        return self.shape[0]


def _alive(refs: list) -> bool:
    """Whether any of the weak references ``refs`` still has its referent (tested in C calls)."""
    return not all(map(_is, map(_deref, refs), _NONES))


def flatten(root: Any, nodes: list | None = None) -> tuple[tuple, list[Any], list[Scalar]]:
    """``(structural key, leaves, scalars)`` of the lazy tree under ``root``, in ``fusion.linearize``'s order.

    The hot path of every realization: ``linearize`` builds a full :class:`~flowgraph.backends.fusion.FusedProgram`
    (dtype strings in its key), needed only when a kernel is compiled. This walk visits the tree the same way
    (inputs depth first, shared subtrees once, leaves deduplicated by identity, scalars not) and keys by dtype
    objects. A realized ``root`` is its own single leaf (the key of a copy). ``nodes``, where given, receives
    the pending arrays of the tree in value order (the root last).
    """
    leaves: list[Any] = []
    scalars: list[Scalar] = []
    code: list[tuple] = []
    # The reference of every array met so far, keyed by the array itself (arrays hash by identity): a leaf's
    # 1001, 1002, ..., a pending value's index (an array is one or the other for the whole walk).
    known: dict[Any, int] = {}

    def visit(x: Any) -> int:
        """Append the pending ``x`` (not visited yet) after its inputs; its value index. Scalar and leaf inputs
        are handled in the loop (no call each): scalars -1, -2, ..., leaves 1001, 1002, ..., values 0, 1, ..."""
        expr = x.lazy
        refs = []
        for i in expr.inputs:
            if type(i) is Scalar:
                scalars.append(i)
                refs.append(-len(scalars))
                continue
            ref = known.get(i)
            if ref is None:
                if i.lazy is None:
                    leaves.append(i)
                    ref = known[i] = 1000 + len(leaves)
                else:
                    ref = visit(i)
            refs.append(ref)
        code.append((expr.op, expr.dtype, tuple(refs)))
        ref = known[x] = len(code) - 1
        if nodes is not None:
            nodes.append(x)
        return ref

    try:
        if type(root) is Scalar:
            scalars.append(root)
        elif root.lazy is None:
            leaves.append(root)
        else:
            visit(root)
    finally:
        # A nested function that calls itself is a reference cycle (function -> closure cell -> function)
        # holding every list it closes over: every array the walk saw would stay alive until the cyclic GC.
        visit = None
    key = (tuple(code), tuple(map(_dtype_of, leaves)), tuple(map(_dtype_of, scalars)))
    return key, leaves, scalars


def _row_computable(key: tuple, dtype: np.dtype) -> bool:
    """Whether a row kernel can compute the program ``key`` (``flatten``'s) of result ``dtype`` at each element
    (``row_kernels.Prologue``): its leaves and scalars of that dtype, its values of it or bool."""
    return (all(dt == dtype for dt in key[1]) and all(dt == dtype for dt in key[2])
            and all(dt == dtype or dt == _BOOL for _, dt, _ in key[0]))


def extra_outputs(nodes: list[Any]) -> list[tuple[int, Any]]:
    """``(value index, array)`` of the interior values of a tree (``nodes`` from :func:`flatten`) that its
    kernel should also write out, because something needs them again after it ran: values autograd saved for
    backward (``Expr.keep``, set by ``LazyEngine.mark_saved``) and values another pending tree reads (a live
    pending consumer outside this one). Left pending, each would be recomputed from its leaves by every later
    kernel that reads it; written out, it is computed once. At most ``fusion.MAX_OUTPUTS``, in value order."""
    found: list[tuple[int, Any]] = []
    inside: set[int] | None = None
    for k in range(len(nodes) - 1):  # the root is last: the kernel's own output
        x = nodes[k]
        if not x.lazy.keep:
            consumers = x.consumers
            # a node inside the tree has its parent among its consumers: an outside one needs a second entry
            if consumers is None or len(consumers) < 2:
                continue
            if inside is None:
                inside = {id(y) for y in nodes}
            if not any((y := r()) is not None and y.lazy is not None and id(y) not in inside for r in consumers):
                continue
        found.append((k, x))
        if len(found) == fusion.MAX_OUTPUTS:
            break
    return found


@functools.lru_cache(maxsize=1024)
def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """``np.broadcast_shapes(a, b)`` as a tuple, remembered: a step broadcasts the same few pairs of shapes
    (a bias over a batch) at every call, and NumPy's answer builds two empty arrays each time (~5 us)."""
    return tuple(np.broadcast_shapes(a, b))


def _no_broadcast(op: str, inputs: Sequence[Any]) -> None:
    """Raise the ShapeError of operands that do not broadcast, naming ``op`` and the shapes of its ``inputs``."""
    shapes = [y.shape for y in inputs if type(y) is not Scalar]
    raise ShapeError(f"{op}: shapes {shapes} do not broadcast together (NumPy rules)") from None


class LazyEngine:
    """Deferred elementwise expressions for a device backend (mixed in before the backend's base class).

    A backend supplies:

    * ``_lazy_type``: its array class. Instances carry ``lazy`` (the pending :class:`Expr` or None),
      ``shape``, ``dtype`` and ``consumers`` (weak references to the pending arrays reading this pending one,
      or None).
    * ``_array_name``: how errors name an operand of this backend ("a CUDA array").
    * ``_operand(x, where)``: ``x`` itself when it is an array of this backend, None when it is not an
      array at all (a candidate scalar); raises for an array of another device.
    * ``_as_leaf(x)``: a realized array of the backend as a realized ``_lazy_type`` (itself where it is one).
    * ``_new_lazy(expr, shape, dtype)``: a pending ``_lazy_type``.
    * ``_broadcast_leaf(x, shape, where)``: realized ``x`` viewed with ``shape`` (zero strides).
    * ``_channel_leaf(v, shape)``: the realized 1-d ``v`` of ``shape[1]`` elements viewed with ``shape``, reading
      ``v[c]`` at every index ``(n, c, ...)`` (zero strides on every other axis).
    * ``_storage_of``: a C callable (an ``operator.attrgetter``) taking a realized ``x`` to the object that is
      its allocation (views share it); ``_storage_id(x)`` is that object's identity.
    * ``_overlaps(a, b)``: whether realized ``a`` may read memory the view ``b`` writes, in another layout.
    * ``_fresh(shape, dtype)``: a new contiguous realized ``_lazy_type`` (uninitialised).
    * ``_take_storage(x, out)``: pending ``x`` becomes realized, holding ``out``'s storage.
    * ``_launch_fused(flat, root, out, outputs=(), extras=())``: run the tree ``root`` (``flat = flatten(root)``)
      into the realized view ``out`` of the same shape, converting to ``out.dtype``; value ``outputs[j]`` of
      the tree (its index in ``flat``'s code) is also written, in its own dtype, into the fresh contiguous
      ``extras[j]`` (``extra_outputs``). ``outputs`` is part of the kernel's key.
    * ``_fill(dst, scalar)``: write one :class:`Scalar` into every element of the realized view ``dst``.
    * ``_strides(x)``: the element strides of the realized ``x`` (zero on broadcast axes).
    * ``check_dtype(dtype, where)``: the dtype, or a BackendError naming what the device supports.
    * ``_emitter``: its ``fusion.CEmitter`` class (row kernels' computed inputs are written in its dialect).
    * ``_update_step(spec, p, g, state, steps, scalars)``: run the fused optimizer update ``spec``
      (``fusion.ADAM_UPDATE``, ``fusion.SGD_UPDATE``) in place on ``p`` and ``state``, after the pending
      readers of those buffers ran; False where it cannot (the generic composite runs instead).
    * ``_scatter(a, axis, index, src, accumulate)``: ``scatter_add`` (``accumulate``) or ``scatter``.
    """

    _lazy_type: type
    _array_name = "an array"
    defers_elementwise = True

    def _init_lazy(self) -> None:
        #: Per allocation (``_storage_id``), the pending arrays that read it directly.
        self._readers: dict[int, list[weakref.ref]] = {}
        self._readers_limit = READER_ENTRIES
        self._result_dtypes: dict[tuple[str, np.dtype], np.dtype] = {}
        #: Per program key (``flatten``'s), whether a row kernel can compute it (``_row_computable``).
        self._row_programs: dict[tuple, bool] = {}

    def _storage_id(self, x: Any) -> int:
        """Identity of the allocation the realized ``x`` lives in (views share it)."""
        return id(self._storage_of(x))

    def is_pending(self, a: Any) -> bool:
        """Whether ``a`` is still a pending expression."""
        return type(a) is self._lazy_type and a.lazy is not None

    # ----------------------------------------------------------------- hazards
    def _add_readers(self, storage: int, refs: list) -> None:
        """Record ``refs`` (weak references to pending arrays) as readers of the allocation ``storage``."""
        found = self._readers.get(storage)
        if found is None:
            if len(self._readers) > self._readers_limit:
                # Entries of freed allocations hold only dead references (a live pending reader keeps its
                # input alive).
                self._readers = {k: v for k, v in self._readers.items() if _alive(v)}
                self._readers_limit = max(READER_ENTRIES, 2 * len(self._readers))
            found = self._readers[storage] = []
        elif len(found) >= PRUNE_READERS and not len(found) % PRUNE_READERS:
            # Readers realized since (no longer a hazard unless they share this storage) or freed.
            found[:] = [r for r in found if (y := r()) is not None and (
                y.lazy is not None or self._storage_id(y) == storage)]
        found += refs

    def _register_reads(self, out: Any, inputs: Sequence[Any]) -> None:
        """Record that pending ``out`` reads ``inputs``: under their allocations, or as a consumer of pending ones
        (``inputs`` holds at least one array: a node of scalars alone is never built)."""
        ref = _ref(out)
        readers = self._readers
        storage_of = self._storage_of
        for x in inputs:
            if type(x) is Scalar:
                continue
            if x.lazy is None:
                storage = id(storage_of(x))
                found = readers.get(storage)
                if found is not None and len(found) < PRUNE_READERS:
                    found.append(ref)  # the common cases inline: no pruning due ...
                elif found is None and len(readers) <= self._readers_limit:
                    readers[storage] = [ref]  # ... and a new allocation's first reader, no registry sweep due
                else:
                    self._add_readers(storage, [ref])
                    readers = self._readers  # a sweep makes a new registry: the next input registers there
            elif x.consumers is None:
                x.consumers = [ref]
            else:
                x.consumers.append(ref)

    def _flush_readers(self, storage: int, keep: Any = None) -> None:
        """Realize the pending arrays that read the allocation ``storage`` (all but ``keep``) before it is
        overwritten. Realizing a direct reader turns it into a leaf for everything above it."""
        readers = self._readers.pop(storage, None)
        if not readers:
            return
        for ref in readers:
            reader = ref()
            if reader is None:
                continue
            if reader is keep:
                self._add_readers(storage, [ref])
            elif reader.lazy is not None:
                self.realize(reader)
            elif self._storage_id(reader) == storage:
                # An in-place write left ``reader`` sharing this storage (``_assign``): give it its own copy.
                out = self._fresh(reader.shape, reader.dtype)
                self._launch_fused(flatten(reader), reader, out)
                self._take_storage(reader, out)

    # ----------------------------------------------------------------- realization and writes
    def mark_saved(self, a: Any) -> None:
        """Autograd saved ``a`` for backward (``tensor._record``): a pending ``a`` is written out by the kernel
        that computes it inside a larger tree (``extra_outputs``) instead of being recomputed when backward
        reads it."""
        if type(a) is self._lazy_type and a.lazy is not None:
            a.lazy.keep = True

    def realize(self, x: Any) -> Any:
        """Run ``x``'s pending expression into a fresh contiguous allocation (no-op when realized or not lazy)."""
        if type(x) is not self._lazy_type or x.lazy is None:
            return x
        out = self._fresh(x.shape, x.dtype)
        nodes: list[Any] = []
        self._evaluate(flatten(x, nodes), nodes, x, out)
        self._realized_into(x, out)
        return x

    def _evaluate(self, flat: tuple, nodes: list[Any], root: Any, out: Any) -> None:
        """Run the tree ``root`` (``flat = flatten(root, nodes)``) into the realized view ``out``. The interior
        values needed again later (``extra_outputs``) are written by the same kernel into fresh allocations
        and become realized there."""
        extras = extra_outputs(nodes) if len(nodes) > 1 else ()
        if not extras:
            self._launch_fused(flat, root, out)
            return
        outs = [self._fresh(x.shape, x.dtype) for _, x in extras]
        self._launch_fused(flat, root, out, tuple([k for k, _ in extras]), outs)
        for (_, x), written in zip(extras, outs):
            self._realized_into(x, written)

    def _realized_into(self, x: Any, out: Any) -> None:
        """Pending ``x`` becomes realized, holding ``out`` (a fresh allocation some kernel wrote ``x``'s
        values into)."""
        self._take_storage(x, out)
        consumers = x.consumers
        if consumers:
            # Whoever read this pending array now reads its allocation.
            x.consumers = None
            self._add_readers(self._storage_id(x), consumers)

    def _pending_pair_sum(self, x: Any) -> tuple | None:
        """``(a, b)`` where ``x`` is a pending ``a + b`` of two realized arrays of its own shape and dtype (the
        autograd engine's sum of two gradient contributions), else None. A row kernel reading ``x`` may add
        the two itself and write the sum out too (``_realized_into``): one pass instead of an add kernel
        before it."""
        expr = x.lazy if type(x) is self._lazy_type else None
        if expr is None or expr.op != "add" or len(expr.inputs) != 2:
            return None
        a, b = expr.inputs
        if type(a) is Scalar or type(b) is Scalar or a.lazy is not None or b.lazy is not None:
            return None
        if a.shape != x.shape or b.shape != x.shape or a.dtype != x.dtype or b.dtype != x.dtype:
            return None
        return a, b

    def _gradient_reads(self, g: Any, allowed: bool) -> tuple[tuple, Any]:
        """``(arrays, g_sum)`` a row kernel reads for the gradient ``g``: the two contributions of a pending
        pair sum (``_pending_pair_sum``, where ``allowed``) and a fresh allocation for the kernel to write their
        sum into (``_realized_into(g, g_sum)`` after the launch), else ``((g,), None)``."""
        pair = self._pending_pair_sum(g) if allowed else None
        if pair is None:
            return (g,), None
        return pair, self._fresh(g.shape, g.dtype)

    def _row_input(self, x: Any, allowed: bool) -> tuple | None:
        """``(flat, out)`` where ``x`` is a pending 2-d expression a row kernel can compute itself at each
        element (``row_kernels.Prologue``): at most ``ROW_INPUT_LEAVES`` leaves, and its leaves, scalars and
        intermediate values of ``x``'s dtype (or bool). ``flat = flatten(x)``; ``out`` is a fresh allocation
        for the kernel to write ``x``'s values into (``_realized_into(x, out)`` after the launch), so every
        other reader finds them realized. None otherwise (the kernel reads ``x`` realized)."""
        if not allowed or type(x) is not self._lazy_type or x.lazy is None or len(x.shape) != 2:
            return None
        flat = flatten(x)
        key, leaves, _ = flat
        if len(leaves) > ROW_INPUT_LEAVES:
            return None
        dtype, shape = x.dtype, x.shape
        fits = self._row_programs.get(key)
        if fits is None:
            if len(self._row_programs) >= ROW_PROGRAMS:
                self._row_programs.clear()
            fits = self._row_programs[key] = _row_computable(key, dtype)
        if not fits:
            return None
        # The engine broadcasts leaves to the node's shape: one of another shape is a broadcast view.
        for leaf in leaves:
            if leaf.shape != shape:
                return None
        return flat, self._fresh(shape, dtype)

    def _prologue(self, pending: Any) -> R.Prologue:
        """The ``row_kernels.Prologue`` computing the pending array ``pending`` (``_row_input``), written by this
        backend's emitter; called only when the kernel that takes it is compiled."""
        return R.prologue(linearize(pending), self._emitter())

    def _write(self, dst: Any, src: Any) -> None:
        """Evaluate ``src`` (a ``_lazy_type`` or a :class:`Scalar`, broadcast, converted) into the realized view
        ``dst``. Pending readers of ``dst`` are the caller's business (``assign`` flushes them)."""
        if type(src) is Scalar:
            if dst.size:
                self._fill(dst, src)
            return
        if src.shape != dst.shape:
            src = self._broadcast_input(src, dst.shape, "assign")
        nodes: list[Any] = []
        flat = flatten(src, nodes)
        storage = self._storage_id(dst)
        for leaf in flat[1]:
            if self._storage_id(leaf) == storage and self._overlaps(leaf, dst):
                # Reads overlapping the write in another layout: stage the source in its own allocation.
                staged = self._fresh(src.shape, src.dtype)
                self._evaluate(flat, nodes, src, staged)
                src, flat, nodes = staged, flatten(staged), []
                break
        self._evaluate(flat, nodes, src, dst)

    def _assign(self, dst: Any, src: Any) -> Any:
        """``assign`` on a realized ``_lazy_type`` view ``dst``: the destination written, or a new array where
        ``dst`` is a broadcast view (which cannot hold distinct values)."""
        if self._operand(src, "assign") is None:
            src = self._scalar(src, dst.dtype, "assign")
        elif type(src) is not self._lazy_type:
            src = self._as_leaf(src)
        if any(s == 0 and n > 1 for n, s in zip(dst.shape, self._strides(dst))):
            out = self._fresh(dst.shape, dst.dtype)
            self._write(out, src)
            return out
        pending = type(src) is self._lazy_type and src.lazy is not None
        if pending and (src.shape != dst.shape or src.dtype != dst.dtype):
            self.realize(src)  # before the write: its expression may read dst
            pending = False
        storage = self._storage_id(dst)
        self._flush_readers(storage, keep=src)
        self._write(dst, src)
        if pending:
            # ``src`` now equals ``dst``: it shares ``dst``'s storage (no copy) until ``dst`` is written again,
            # when ``_flush_readers`` gives it its own copy; its pending readers now read that storage.
            consumers = src.consumers
            src.consumers = None
            self._take_storage(src, dst)
            self._add_readers(storage, [_ref(src), *(consumers or ())])
        return dst

    def concatenate(self, arrays: Sequence[Any], axis: int) -> Any:
        """Join arrays of one dtype along ``axis``: each piece is written straight into its slice of one fresh
        array, a pending piece by the kernel that computes it (no realized copy of it first)."""
        pieces = [self._operand(x, "concatenate") for x in arrays]
        if not pieces:
            raise BackendError("concatenate: needs at least one array")
        if any(x is None for x in pieces):
            raise BackendError(f"concatenate: expected {self._array_name} for every piece")
        first = pieces[0]
        if not -len(first.shape) <= axis < len(first.shape):
            raise ShapeError(f"concatenate: axis {axis} is out of range for arrays of {len(first.shape)} dims")
        axis %= len(first.shape)
        for x in pieces[1:]:
            if x.dtype != first.dtype:
                raise BackendError(f"concatenate: dtypes {first.dtype} and {x.dtype} differ; cast first")
            if len(x.shape) != len(first.shape) or any(
                    n != m for d, (n, m) in enumerate(zip(x.shape, first.shape)) if d != axis):
                raise ShapeError(f"concatenate: shapes {[tuple(y.shape) for y in pieces]} differ outside axis "
                                 f"{axis}")
        shape = list(first.shape)
        shape[axis] = sum(x.shape[axis] for x in pieces)
        out = self._fresh(tuple(shape), first.dtype)
        start = 0
        for x in pieces:
            size = x.shape[axis]
            if size and all(shape):
                index = tuple(slice(start, start + size) if d == axis else slice(None) for d in range(len(shape)))
                self._write(self._as_leaf(self.slice(out, index)), self._as_leaf(x))
            start += size
        return out

    # ----------------------------------------------------------------- building
    def _broadcast_input(self, x: Any, shape: tuple, where: str) -> Any:
        """``x`` as an operand of ``shape``: a broadcast view, or a pending tree over broadcast leaves."""
        if x.lazy is None:
            return self._broadcast_leaf(x, shape, where)
        if x.lazy.nodes > BROADCAST_RECOMPUTE_NODES or not fusion.is_enabled():
            return self._broadcast_leaf(self.realize(x), shape, where)
        memo: dict[int, Any] = {}

        def clone(y: Any) -> Any:
            if type(y) is Scalar:
                return y
            if y.lazy is None:
                return self._broadcast_leaf(y, shape, where)
            found = memo.get(id(y))
            if found is None:
                inputs = [clone(i) for i in y.lazy.inputs]
                found = self._new_lazy(Expr(y.lazy.op, inputs, y.dtype), shape, y.dtype)
                self._register_reads(found, inputs)
                memo[id(y)] = found
            return found

        try:
            return clone(x)
        finally:
            clone = None  # a self-calling closure is a reference cycle that would keep the arrays alive until gc

    def _node(self, op: str, inputs: Sequence[Any], dtype: np.dtype) -> Any:
        """A pending ``op`` over ``inputs`` (arrays of this backend, or :class:`Scalar` s) giving ``dtype``."""
        lazy_type = self._lazy_type
        prepared: Sequence[Any] | None = None
        n = len(inputs)
        if n == 2:  # the commonest cases first: an array and a scalar, two arrays of one shape
            a, b = inputs
            if type(a) is Scalar:
                b = b if type(b) is lazy_type else self._as_leaf(b)
                shape, prepared = b.shape, (a, b)
            else:
                same = b is a
                a = a if type(a) is lazy_type else self._as_leaf(a)
                if type(b) is Scalar or same:
                    shape, prepared = a.shape, (a, b if not same else a)
                else:
                    b = b if type(b) is lazy_type else self._as_leaf(b)
                    shape = a.shape
                    if b.shape != shape:  # a bias, a per-channel scale: one operand broadcast
                        try:
                            shape = _broadcast(shape, b.shape)
                        except ValueError:
                            _no_broadcast(op, inputs)
                        if a.shape != shape:
                            a = self._broadcast_input(a, shape, op)
                        if b.shape != shape:
                            b = self._broadcast_input(b, shape, op)
                    prepared = (a, b)
        elif n == 1 and type(inputs[0]) is not Scalar:
            a = inputs[0]
            a = a if type(a) is lazy_type else self._as_leaf(a)
            shape, prepared = a.shape, (a,)
        if prepared is None:
            shape, prepared = self._broadcast_operands(op, inputs)
        return self._node_shaped(op, prepared, dtype, shape)

    def _node_shaped(self, op: str, prepared: Sequence[Any], dtype: np.dtype, shape: tuple) -> Any:
        """``_node`` for ``prepared`` operands: each a ``_lazy_type`` of ``shape`` (the result's) or a
        :class:`Scalar`, an operand given twice the same object (the normalization instructions, whose
        per-channel operands are broadcast views already, come here straight)."""
        expr = Expr(op, prepared, dtype)
        if expr.too_big():
            for x in prepared:
                if type(x) is self._lazy_type and x.lazy is not None:
                    self.realize(x)
            expr = Expr(op, prepared, dtype)
        out = self._new_lazy(expr, shape, dtype)
        if not fusion._ENABLED[0]:
            return self.realize(out)
        self._register_reads(out, prepared)
        return out

    def _broadcast_operands(self, op: str, inputs: Sequence[Any]) -> tuple[tuple, list[Any]]:
        """``(shape, operands)`` of a pending ``op`` over ``inputs``: the broadcast shape, and each input as a
        ``_lazy_type`` of that shape (a broadcast view or a re-expressed tree, ``_broadcast_input``), the same
        object for an input given twice."""
        shape = None
        for x in inputs:
            if type(x) is Scalar:
                continue
            if shape is None:
                shape = x.shape
            elif x.shape != shape:
                try:
                    shape = _broadcast(shape, x.shape)
                except ValueError:
                    _no_broadcast(op, inputs)
        lazy_type = self._lazy_type
        prepared: list[Any] = []
        seen: dict[int, Any] = {}
        for x in inputs:
            if type(x) is Scalar:
                prepared.append(x)
                continue
            operand = seen.get(id(x))
            if operand is None:
                operand = x if type(x) is lazy_type else self._as_leaf(x)
                if operand.shape != shape:
                    operand = self._broadcast_input(operand, shape, op)
                seen[id(x)] = operand
            prepared.append(operand)
        return shape, prepared

    def _scalar(self, value: Any, dtype: np.dtype, where: str) -> Scalar:
        if not isinstance(value, SCALAR_TYPES):
            raise BackendError(
                f"{where}: expected {self._array_name} or a Python scalar, got {type(value).__name__}"
            )
        try:
            converted = dtype.type(value)
        except (OverflowError, ValueError, TypeError):
            # out of the dtype's range (int8 + 1000): the C cast, wrapping as PyTorch does
            converted = np.array(value).astype(dtype)[()]
        s = Scalar.__new__(Scalar)
        s.dtype = dtype
        s.value = converted
        return s

    def _result_dtype(self, op: str, dtype: np.dtype) -> np.dtype:
        key = (op, dtype)
        found = self._result_dtypes.get(key)
        if found is None:
            found = self._result_dtypes[key] = self.check_dtype(result_dtype(op, dtype), op)
        return found

    # ----------------------------------------------------------------- optimizer updates and scatters
    def adam_step(self, p: Any, g: Any, m: Any, v: Any, beta1: float, beta2: float, step_size: Any,
                  eps_hat: Any, l2: float = 0.0, decay: Any = 1.0, maximize: bool = False,
                  v_max: Any = None) -> tuple:
        """Optional fused composite (see ``NumpyBackend.adam_step``): one kernel updates ``p``, ``m``, ``v``.

        ``step_size`` and ``eps_hat`` are host numbers, or 0-d float32 device arrays inside ``fg.jit`` /
        ``fg.capture`` (read on the device, so a replayed step uses the step's current values). The generic
        default runs instead with AMSGrad (``v_max``), a device ``decay``, or unless ``p``, ``m``, ``v`` are
        contiguous float32/float64 arrays of one dtype (``_update_step`` says).
        """
        fits = v_max is None and fusion.is_host_scalar(decay)
        if fits and self._update_step(fusion.ADAM_UPDATE, p, g, (m, v), (step_size, eps_hat),
                                      fusion.adam_update_scalars(beta1, beta2, l2, decay, maximize)):
            return p, m, v, None
        return super().adam_step(p, g, m, v, beta1, beta2, step_size, eps_hat, l2, decay, maximize, v_max)

    def sgd_step(self, p: Any, g: Any, buf: Any, lr: Any, momentum: float, dampening: float,
                 weight_decay: float, nesterov: bool, maximize: bool) -> tuple:
        """Optional fused composite: one SGD-with-momentum step in one kernel (``p`` and ``buf`` in place).

        ``lr`` is a host number or a 0-d float32 device array (inside ``fg.jit`` / ``fg.capture``). The generic
        default runs instead on the first step (no ``buf``), without momentum, or unless ``p`` and ``buf`` are
        contiguous float32/float64 arrays of one dtype.
        """
        fits = buf is not None and momentum != 0
        if fits and self._update_step(fusion.SGD_UPDATE, p, g, (buf,), (lr,),
                                      fusion.sgd_update_scalars(momentum, dampening, weight_decay, nesterov,
                                                                maximize)):
            return p, buf
        return super().sgd_step(p, g, buf, lr, momentum, dampening, weight_decay, nesterov, maximize)

    def scatter_add(self, a: Any, axis: int, index: Any, src: Any) -> Any:
        """``Backend.scatter_add`` through the backend's ``_scatter``."""
        return self._scatter(a, axis, index, src, accumulate=True)

    def scatter(self, a: Any, axis: int, index: Any, src: Any) -> Any:
        """``Backend.scatter`` through the backend's ``_scatter``."""
        return self._scatter(a, axis, index, src, accumulate=False)

    # ----------------------------------------------------------------- batch norm (shared by CUDA and OpenCL)
    #: Below this many elements per row (``prod(S)`` of ``(N, C, *S)``; 1 for BatchNorm1d's ``(N, C)``) the rows
    #: are too short for a work-group each: the generic default runs.
    BATCH_NORM_MIN_COLS = 4

    def _batch_norm_layout(self, x: Any, *per_channel: Any) -> tuple[int, int, int] | None:
        """``(n, channels, cols)`` where the batch norm kernels take ``x`` (float32/float64, rows long enough,
        the per-channel arrays of its dtype), else None."""
        shape = tuple(x.shape)
        if x.dtype not in (np.float32, np.float64) or len(shape) < 3 or 0 in shape or any(
                t is not None and t.dtype != x.dtype for t in per_channel):
            return None
        cols = 1
        for d in shape[2:]:
            cols *= d
        return (shape[0], shape[1], cols) if cols >= self.BATCH_NORM_MIN_COLS else None

    def _per_channel(self, v: Any, shape: tuple) -> Any:
        """The per-channel values ``v`` (``shape[1]`` of them) as a realized operand of ``shape``: one zero-stride
        view (``_channel_leaf``) instead of a reshape to ``(1, C, 1, ...)`` and a broadcast view of that, each an
        array object and a backend call, for every operand of every normalization step."""
        v = self._as_leaf(v) if type(v) is not self._lazy_type else self.realize(v)
        if tuple(v.shape) != (shape[1],):  # C values in another shape: viewed as (1, C, 1, ...), broadcast
            view = self._as_leaf(self.reshape(v, (1, shape[1]) + (1,) * (len(shape) - 2)))
            return self._broadcast_leaf(view, shape, "batch_norm")
        return self._channel_leaf(v, shape)

    def batch_norm(self, x: Any, weight: Any, bias: Any, eps: float, running_mean: Any = None,
                   running_var: Any = None, momentum: float = 0.1, batches: Any = None) -> tuple:
        """Two kernels (``row_kernels.BATCH_NORM_ROW_MOMENTS``, then ``batch_norm_stats``, which also updates
        the running statistics in place where they are contiguous and of ``x``'s dtype, and then counts the
        batch in an int64 ``batches``: no launch of its own for either) and ``y = (x - mean) * scale + bias``
        left pending as one instruction (``norm_affine``), to be computed by the kernel that reads it (a
        ReLU's, a convolution's input copy); the generic default where ``_batch_norm_layout`` refuses."""
        layout = self._batch_norm_layout(x, weight, bias)
        if layout is None or not fusion.is_enabled():
            return super().batch_norm(x, weight, bias, eps, running_mean, running_var, momentum, batches)
        n, c, cols = layout
        dtype = x.dtype
        xr = self._row_operand(x, "batch_norm")
        row_mean, row_m2 = self._fresh((n * c,), dtype), self._fresh((n * c,), dtype)
        self._launch_rows(R.BATCH_NORM_ROW_MOMENTS, ("bn_rows",), dtype, n * c, cols, [cols, xr, row_mean, row_m2])
        # the kernel updates the running buffers where it can write them as they are (contiguous, x's dtype)
        in_kernel = all(r is not None and r.dtype == dtype and self.is_contiguous(r)
                        for r in (running_mean, running_var))
        runs = [self._row_operand(r, "batch_norm") for r in (running_mean, running_var)] if in_kernel else []
        mean, var, rstd, scale = (self._fresh((c,), dtype) for _ in range(4))
        w = None if weight is None else self._row_operand(weight, "batch_norm")
        count = n * cols
        unbias = count / max(count - 1, 1)
        args: list[Any] = [n, c, cols, row_mean, row_m2, *(() if w is None else (w,))]
        counted = in_kernel and batches is not None and batches.dtype == _I64
        if in_kernel:
            if counted:
                runs.append(self._row_operand(batches, "batch_norm"))
            for r in runs:
                self._flush_readers(self._storage_id(self._as_leaf(r)))
            args += runs
        args += [mean, var, rstd, scale, float(eps), float(momentum), float(unbias)]
        has = (w is not None, in_kernel, counted)
        self._launch_rows(lambda: R.batch_norm_stats(*has), ("bn_stats", *has), dtype, c, n, args)
        if not in_kernel:
            self._update_running(running_mean, running_var, mean, var, momentum, unbias)
        if not counted:
            self._count_batch(batches)
        shape = tuple(x.shape)
        per_channel = [self._per_channel(t, shape) for t in ((mean, scale) if bias is None else (mean, scale, bias))]
        y = self._node_shaped("norm_scale" if bias is None else "norm_affine", (self._as_leaf(xr), *per_channel),
                              dtype, shape)
        return y, mean, var, rstd

    def batch_norm_backward(self, g: Any, x: Any, mean: Any, rstd: Any, weight: Any, need_x: bool, need_w: bool,
                            need_b: bool) -> tuple:
        """Two kernels (``BATCH_NORM_ROW_GRAD_SUMS``, then ``batch_norm_grads``: ``gw``, ``gb`` and the input
        gradient's per-channel coefficients) and ``gx = g * a + (x - mean) * b + c`` left pending as one
        instruction (``norm_input_grad``); the generic default where ``_batch_norm_layout`` refuses."""
        layout = self._batch_norm_layout(x, mean, rstd, weight)
        if layout is None or g.dtype != x.dtype or tuple(g.shape) != tuple(x.shape) or not fusion.is_enabled():
            return super().batch_norm_backward(g, x, mean, rstd, weight, need_x, need_w, need_b)
        n, c, cols = layout
        dtype = x.dtype
        gr, xr = self._row_operand(g, "batch_norm_backward"), self._row_operand(x, "batch_norm_backward")
        mean, rstd = self._row_operand(mean, "batch_norm_backward"), self._row_operand(rstd, "batch_norm_backward")
        sg, sgc = self._fresh((n * c,), dtype), self._fresh((n * c,), dtype)
        self._launch_rows(R.BATCH_NORM_ROW_GRAD_SUMS, ("bn_grad_rows",), dtype, n * c, cols,
                          [cols, c, gr, xr, mean, sg, sgc])
        w = None if weight is None else self._row_operand(weight, "batch_norm_backward")
        gw, gb, a, b, k = (self._fresh((c,), dtype) for _ in range(5))
        self._launch_rows(lambda: R.batch_norm_grads(w is not None), ("bn_grads", w is not None), dtype, c, n,
                          [n, c, cols, sg, sgc, rstd, *(() if w is None else (w,)), gw, gb, a, b, k])
        gx = None
        if need_x:
            shape = tuple(x.shape)
            a, b, k, mean = (self._per_channel(t, shape) for t in (a, b, k, mean))
            gx = self._node_shaped("norm_input_grad", (self._as_leaf(gr), a, self._as_leaf(xr), mean, b, k), dtype,
                                   shape)
        return gx, gw if need_w else None, gb if need_b else None

    def gelu_exact(self, x: Any, grad: bool = True) -> tuple[Any, None]:
        """Exact GELU as one pending ``gelu`` instruction, and nothing saved: the backward computes the
        derivative from ``x`` in the kernel that consumes it (one input-sized array fewer kept per GELU, as
        PyTorch keeps only the input). With fusion off, the generic default."""
        if not fusion.is_enabled():
            return super().gelu_exact(x, grad)
        return self._unary("gelu", x), None

    def gelu_exact_backward(self, g: Any, x: Any, saved: Any) -> Any:
        """``g * gelu_grad(x)``, two pending instructions (``saved`` is used where the generic forward made it)."""
        if saved is not None or not fusion.is_enabled():
            return super().gelu_exact_backward(g, x, saved)
        return self.mul(g, self._unary("gelu_grad", x))

    def _unary(self, op: str, a: Any) -> Any:
        """A pending ``op(a)``."""
        if self._operand(a, op) is None:
            raise BackendError(f"{op}: expected {self._array_name}, got {type(a).__name__}")
        dtype = self._result_dtype(op, a.dtype)
        if fusion._ENABLED[0]:
            return self._pending(op, a, None, dtype)
        return self._node(op, (a,), dtype)

    def _pending(self, op: str, a: Any, b: Any, dtype: np.dtype) -> Any:
        """``_node`` for the commonest nodes, with fusion on: ``op`` over one array ``a`` (``b`` None) or two of one
        shape and dtype, giving ``dtype``. No broadcast, scalar or operand-list walk; a tree past the caps
        (``Expr.too_big``) takes ``_node_shaped``'s way."""
        lazy_type = self._lazy_type
        same = b is a
        if type(a) is not lazy_type:
            a = self._as_leaf(a)
        if same:
            b = a
        elif b is not None and type(b) is not lazy_type:
            b = self._as_leaf(b)
        expr = Expr.over(op, a, b, dtype)
        if expr.too_big():
            return self._node_shaped(op, expr.inputs, dtype, a.shape)
        out = self._new_lazy(expr, a.shape, dtype)
        self._register_reads(out, expr.inputs)
        return out

    def _binary(self, op: str, a: Any, b: Any) -> Any:
        """A pending ``op(a, b)``: one dtype for both operands; a Python scalar takes the array's dtype."""
        if self._operand(a, op) is not None:
            dtype = a.dtype
            if self._operand(b, op) is not None:
                if b.dtype != dtype:
                    raise BackendError(
                        f"{op}: operands have dtypes {a.dtype} and {b.dtype}; the backend takes one dtype "
                        "(promote first, e.g. with cast)"
                    )
                if fusion._ENABLED[0]:
                    sa, sb = a.shape, b.shape
                    if sa != sb and len(sb) < len(sa) and sa[len(sa) - len(sb):] == sb and (
                            type(b) is not self._lazy_type or b.lazy is None):
                        b = self._broadcast_leaf(self._as_leaf(b), sa, op)  # a realized row over a's rows: a bias
                        sb = sa
                    if sa == sb:  # the commonest case: two arrays of one shape
                        return self._pending(op, a, b, self._result_dtype(op, dtype))
            else:
                if op == "pow" and dtype.kind in "iu" and isinstance(b, SCALAR_TYPES) and b < 0:
                    # NumPy's rule, checked where the exponent is at hand (array exponents are not read back).
                    raise BackendError(
                        f"pow: integers to negative integer powers are not allowed ({dtype} ** {b}); "
                        "cast the base to a float dtype first"
                    )
                b = self._scalar(b, dtype, op)
        elif self._operand(b, op) is not None:
            dtype = b.dtype
            a = self._scalar(a, dtype, op)
        else:
            raise BackendError(
                f"{op}: needs at least one operand that is {self._array_name}, got {type(a).__name__} and "
                f"{type(b).__name__}"
            )
        return self._node(op, (a, b), self._result_dtype(op, dtype))

    def _where(self, cond: Any, a: Any, b: Any) -> Any:
        """A pending ``where(cond, a, b)``."""
        arrays = [x for x in (a, b) if self._operand(x, "where") is not None]
        if arrays:
            dtype = arrays[0].dtype
            if len(arrays) == 2 and b.dtype != dtype:
                raise BackendError(f"where: branches have dtypes {a.dtype} and {b.dtype}; cast one first")
        else:
            dtype = np.result_type(a, b)
        dtype = self.check_dtype(np.dtype(dtype), "where")
        inputs = [x if self._operand(x, "where") is not None else self._scalar(x, dtype, "where") for x in (a, b)]
        if self._operand(cond, "where") is None:
            cond = self._scalar(cond, _BOOL, "where")
        elif cond.dtype != _BOOL:
            cond = self._cast(cond, _BOOL)
        if all(type(x) is Scalar for x in (cond, *inputs)):
            raise BackendError(f"where: at least one of cond, a, b must be {self._array_name}")
        return self._node("where", (cond, *inputs), dtype)

    def _cast(self, a: Any, dtype: Any) -> Any:
        """A pending conversion of ``a`` to ``dtype`` (``a`` itself when it already has it)."""
        if self._operand(a, "cast") is None:
            raise BackendError(f"cast: expected {self._array_name}, got {type(a).__name__}")
        dtype = np.dtype(dtype)
        if a.dtype == dtype:
            return a
        self.check_dtype(dtype, "cast")
        return self._node("cast", (a,), dtype)
