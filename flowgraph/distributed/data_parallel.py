"""``DataParallel``: gradient averaging across ranks with size-bounded buckets, as PyTorch's DDP.

How it plugs into the engine: a per-parameter hook (``Tensor.register_hook``) marks the parameter ready and
records its gradient. flowgraph's backward finishes each leaf (its ``AccumulateGrad`` node: hooks, then ``.grad``) as
soon as the last node feeding it has run, so when every parameter of a bucket is ready (and every
earlier bucket was launched: all ranks launch buckets in the same order) the bucket is all-reduced in place, as
one collective group, while the rest of backward still runs (NCCL works on its own stream). When the last
bucket completes, the hook finishes: it waits for the collectives (a device-side wait), writes the averaged
gradients into ``.grad`` and returns the current parameter's (the engine writes it).
:meth:`DataParallel.finish_gradients` does the same by hand (needed only when some parameter got no gradient).

Gradient accumulation without communication, as DDP: inside ``with dp.no_sync():`` (or while
``dp.require_backward_grad_sync`` is ``False``, nanoGPT's toggle) the hooks stand aside and backward leaves each
rank's local gradients in ``.grad``; the first backward after it reduces, per parameter, the whole accumulated
``.grad`` (what was accumulated locally plus this backward's gradient), so k micro-batches cost one all-reduce.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..autograd.grad_mode import no_grad
from ..errors import FlowError
from ..nn.module import Module
from ..tensor import Tensor, tensor, zeros_like
from .comm import Communicator


def assign_buckets(params: Sequence[Tensor], bucket_cap_mb: float = 25.0, order: Sequence[int] | None = None,
                   units: Sequence[Any] | None = None, first_bucket_mb: float | None = None) -> list[list[int]]:
    """Group parameter indices into buckets of at most ``bucket_cap_mb`` MiB, in the order backward makes them.

    ``order`` is that order (parameter indices); by default reverse registration order, which approximates it
    (last layer first, as in DDP). :class:`DataParallel` records the real order during the first backward and
    rebuilds its buckets with it. ``units`` gives each parameter a key of the group whose gradients one backward
    op produces together (its module: a Linear's weight and bias), so a bucket never waits for a parameter of the
    next layer that becomes ready only later; consecutive parameters (in ``order``) with one key stay in one
    bucket. ``first_bucket_mb`` caps the first bucket (default and at most ``bucket_cap_mb``): small, so the first
    all-reduce starts while most of backward is still to run. Only parameters with ``requires_grad`` are placed
    (frozen ones are in no bucket). A bucket holds one dtype and one device; a parameter (or unit) larger than
    the cap gets a bucket of its own.
    """
    if bucket_cap_mb <= 0 or (first_bucket_mb is not None and first_bucket_mb <= 0):
        raise FlowError(f"bucket_cap_mb and first_bucket_mb must be positive, got {bucket_cap_mb} and "
                        f"{first_bucket_mb}")
    cap = bucket_cap_mb * 1024 * 1024
    first = cap if first_bucket_mb is None else min(cap, first_bucket_mb * 1024 * 1024)
    if order is None:
        order = list(reversed(range(len(params))))
    # runs of consecutive parameters of one unit, dtype and device
    runs: list[tuple[Any, list[int], int]] = []
    for i in order:
        p = params[i]
        if not p.requires_grad:
            continue
        key = (p.dtype, p.device, i if units is None else units[i])
        nbytes = p.numel() * p.element_size()
        if runs and runs[-1][0] == key:
            runs[-1][1].append(i)
            runs[-1] = (key, runs[-1][1], runs[-1][2] + nbytes)
        else:
            runs.append((key, [i], nbytes))
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    kind = None
    for key, idx, nbytes in runs:
        limit = cap if buckets else first
        if current and (size + nbytes > limit or key[:2] != kind):
            buckets.append(current)
            current, size = [], 0
        current.extend(idx)
        size += nbytes
        kind = key[:2]
    if current:
        buckets.append(current)
    return buckets


class DataParallel(Module):
    """Wrap ``module`` so that ``backward`` leaves the gradients averaged over all ranks.

    At construction the parameters and buffers are broadcast from rank 0. Parameters that require grad are
    assigned to buckets (:func:`assign_buckets`: reverse registration order, a module's parameters together, the
    first bucket at most ``first_bucket_mb`` MiB, the others ``bucket_cap_mb``); each bucket is all-reduced as
    soon as all its gradients are ready, and the averaged gradients are in ``.grad`` when ``backward`` returns.
    The first backward that reduces every parameter records the order its gradients came in, and the buckets
    are rebuilt in that order (rank 0's, broadcast, so all ranks agree), as PyTorch's DDP does after its first
    iteration. ``broadcast_buffers`` copies rank 0's buffers (e.g. BatchNorm running statistics) to every rank at
    each training forward (skipped for a module that had no buffers when it was wrapped, as DDP keeps the
    buffers it found at construction).
    ``sync_batchnorm=True`` replaces the module's BatchNorm layers by :class:`SyncBatchNorm` (statistics over the
    global batch, sharing the same parameters and buffers); otherwise each rank normalises with its local batch.
    ``find_unused_parameters=True`` lets some parameters get no gradient in a step; then call
    :meth:`finish_gradients` after ``backward`` (they are reduced as zeros).
    ``communicator`` defaults to the one ``flowgraph.distributed.init()`` created. The wrapped model is
    ``.module``; save ``dp.module.state_dict()`` to get the keys of the unwrapped model.

    Gradient accumulation: run the first micro-batches inside :meth:`no_sync` (or with
    ``require_backward_grad_sync = False``, PyTorch's attribute), the last one outside; as in PyTorch, the
    setting in force at ``forward`` decides whether that pass's backward all-reduces.
    """

    def __init__(self, module: Module, bucket_cap_mb: float = 25.0, broadcast_buffers: bool = True,
                 sync_batchnorm: bool = False, find_unused_parameters: bool = False,
                 communicator: Communicator | None = None, first_bucket_mb: float = 1.0) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise FlowError(f"DataParallel wraps an nn.Module, got {type(module).__name__}")
        if communicator is None:
            from . import get_communicator

            communicator = get_communicator()
        if sync_batchnorm:
            from .sync_batchnorm import SyncBatchNorm

            module = SyncBatchNorm.convert_sync_batchnorm(module, communicator)
        self.module = module
        object.__setattr__(self, "_comm", communicator)
        object.__setattr__(self, "broadcast_buffers", bool(broadcast_buffers))
        object.__setattr__(self, "find_unused_parameters", bool(find_unused_parameters))
        names, params = [], []
        for name, p in module.named_parameters():
            names.append(name)
            params.append(p)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_params", params)
        buffers = list(module.buffers())
        # DDP's rule too: the buffers a module has when it is wrapped are the ones kept in sync
        object.__setattr__(self, "_has_buffers", bool(buffers))
        with no_grad():
            for p in params:
                communicator.broadcast(p, 0)
            for b in buffers:
                communicator.broadcast(b, 0)
        # a module's parameters come out of one backward op together (a Linear's weight and bias)
        units = [name.rpartition(".")[0] for name in names]
        caps = dict(bucket_cap_mb=bucket_cap_mb, units=units, first_bucket_mb=first_bucket_mb)
        object.__setattr__(self, "_caps", caps)
        self._set_buckets(assign_buckets(params, **caps))
        object.__setattr__(self, "_order", [])  # parameter indices in the order the first backward made them
        object.__setattr__(self, "_rebuilt", False)
        object.__setattr__(self, "_handles", [params[i].register_hook(self._make_hook(i)) for i in self._bucket_of])
        #: PyTorch's DDP attribute: ``False`` makes the next forward's backward accumulate local gradients only.
        object.__setattr__(self, "require_backward_grad_sync", True)
        object.__setattr__(self, "_sync_backward", True)  # the setting at the last forward
        object.__setattr__(self, "_unsynced", False)  # .grad holds local gradients that were never reduced
        self._reset()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside this context, forward/backward passes accumulate local gradients without all-reducing them;
        the first backward of a forward run outside it reduces the accumulated gradients, as PyTorch's
        ``DistributedDataParallel.no_sync``::

            with dp.no_sync():
                (loss_fn(dp(x1), y1) / 2).backward()      # local only, no communication
            (loss_fn(dp(x2), y2) / 2).backward()          # reduces both micro-batches' gradients
            opt.step()
        """
        old = self.require_backward_grad_sync
        object.__setattr__(self, "require_backward_grad_sync", False)
        try:
            yield
        finally:
            object.__setattr__(self, "require_backward_grad_sync", old)

    def _set_buckets(self, buckets: list[list[int]]) -> None:
        object.__setattr__(self, "buckets", buckets)
        object.__setattr__(self, "_bucket_of", {i: b for b, idx in enumerate(buckets) for i in idx})

    def _rebuild_buckets(self) -> None:
        """Bucket again in the order the first fully reduced backward produced the gradients (``_order``), rank
        0's order on every rank (a broadcast), so each bucket's gradients are ready at about the same time."""
        object.__setattr__(self, "_rebuilt", True)
        order = tensor(self._order, dtype="int64", device=self._params[self._order[0]].device)
        self._comm.broadcast(order, 0)
        self._set_buckets(assign_buckets(self._params, order=[int(i) for i in order.tolist()], **self._caps))

    # ------------------------------------------------------------------ per-backward state
    def _reset(self) -> None:
        object.__setattr__(self, "_ready", {})  # param index -> (grad before this backward, this backward's grad)
        object.__setattr__(self, "_missing", [len(b) for b in self.buckets])
        object.__setattr__(self, "_reduced", {})  # param index -> averaged gradient
        object.__setattr__(self, "_next_bucket", 0)

    def _make_hook(self, i: int):
        return functools.partial(self._on_grad, i)

    def _on_grad(self, i: int, grad: Tensor) -> Tensor | None:
        if not self._sync_backward:
            object.__setattr__(self, "_unsynced", True)
            return None  # the engine accumulates the local gradient into .grad
        if i in self._ready:
            raise FlowError(f"DataParallel: parameter {self._names[i]!r} got two gradients before the buckets were "
                            "reduced (is it used in two backward passes of one step? call finish_gradients())")
        g, dtype = grad, self._params[i].dtype
        if g.requires_grad or g.dtype != dtype:  # create_graph, or a gradient of another dtype
            with no_grad():
                g = g.detach().to(dtype)
        if not self._rebuilt:
            self._order.append(i)
        self._record(i, g)
        self._missing[self._bucket_of[i]] -= 1
        self._launch_ready()
        if self._next_bucket == len(self.buckets):
            return self._finish(current=i)
        return None

    def _record(self, i: int, g: Tensor) -> None:
        """Keep ``(gradient before this backward, gradient to reduce)`` for parameter ``i``. After ``no_sync``
        the gradient before is local to this rank: it is reduced together with this backward's."""
        prev = self._params[i].grad
        if self._unsynced and prev is not None:
            with no_grad():
                g, prev = prev + g, None
        self._ready[i] = (prev, g)

    def _launch_ready(self) -> None:
        while self._next_bucket < len(self.buckets) and self._missing[self._next_bucket] == 0:
            self._reduce_bucket(self._next_bucket)
            object.__setattr__(self, "_next_bucket", self._next_bucket + 1)

    def _reduce_bucket(self, b: int) -> None:
        idx = self.buckets[b]
        with no_grad():
            grads, seen = [], set()
            for i in idx:
                g = self._ready[i][1].contiguous()
                if id(g._data) in seen or g is self._ready[i][0]:
                    g = g.clone()  # one array shared by two gradients (or the old .grad): reduce a copy
                seen.add(id(g._data))
                grads.append(g)
            # In place, one collective group per bucket: no flattening copy, the average done by NCCL.
            self._comm.all_reduce_coalesced(grads, "avg", async_op=True)  # _finish synchronizes
            for i, g in zip(idx, grads):
                self._reduced[i] = g

    def _finish(self, current: int | None) -> Tensor | None:
        self._comm.synchronize()
        out = None
        with no_grad():
            for i, avg in self._reduced.items():
                prev = self._ready[i][0]
                if i == current:
                    # The engine adds the returned gradient to .grad: make .grad what it should be added to
                    # (None where the local accumulation was reduced into avg).
                    self._params[i].grad = prev
                    out = avg
                    continue
                self._params[i].grad = avg if prev is None else prev + avg
        object.__setattr__(self, "_unsynced", False)
        if not self._rebuilt:
            if len(self._order) == len(self._bucket_of):
                self._rebuild_buckets()
            else:  # some parameter got no gradient (finish_gradients): record the next backward instead
                self._order.clear()
        self._reset()
        return out

    def finish_gradients(self) -> None:
        """Reduce what is left of this backward and write the averaged gradients into ``.grad``.

        Called automatically when the last bucket completes; call it by hand after ``backward`` when some
        parameters got no gradient (needs ``find_unused_parameters=True``: they are reduced as zeros). A no-op
        when nothing is pending. Every rank must call it at the same point.
        """
        if not self._ready:
            return
        missing = [i for i in sorted(self._bucket_of) if i not in self._ready]
        if missing and not self.find_unused_parameters:
            raise FlowError("DataParallel: no gradient for parameters " + str([self._names[i] for i in missing])
                            + "; construct with find_unused_parameters=True if some parameters are unused")
        for i in missing:
            self._record(i, zeros_like(self._params[i]))
            self._missing[self._bucket_of[i]] -= 1
        self._launch_ready()
        self._finish(current=None)

    # ------------------------------------------------------------------ forward
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Check the previous step finished, note whether this pass's backward reduces (``no_sync``), broadcast
        buffers from rank 0 (training), and call the module."""
        if self._ready:
            missing = [self._names[i] for i in sorted(self._bucket_of) if i not in self._ready]
            raise FlowError("DataParallel: the previous backward left gradients unreduced (no gradient for "
                            f"{missing}); call finish_gradients() after backward, with find_unused_parameters=True")
        object.__setattr__(self, "_sync_backward", bool(self.require_backward_grad_sync))
        if self._has_buffers and self.broadcast_buffers and self.training and self._comm.world_size > 1:
            with no_grad():
                for b in self.module.buffers():
                    self._comm.broadcast(b, 0)
        return self.module(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"world_size={self._comm.world_size}, buckets={[len(b) for b in self.buckets]}"


__all__ = ["DataParallel", "assign_buckets"]
