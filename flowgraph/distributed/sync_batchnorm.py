"""``SyncBatchNorm``: BatchNorm whose training statistics cover the batch of every rank (PyTorch's name).

In training, each rank sums its input and its squares per channel and the sums (with the element count) are
all-reduced, so every rank normalises with the mean and variance of the global batch. The all-reduce is a
differentiable op (:func:`all_reduce_sum`: its backward all-reduces the incoming gradient), so backward gives
the exact gradient of the global-batch normalisation; with ``DataParallel``'s gradient averaging, training
equals single-process training on the concatenated batch. In evaluation mode, or outside a process group of
more than one rank, it is a plain BatchNorm.
"""

from __future__ import annotations

from ..autograd.grad_mode import no_grad
from ..errors import FlowError, ShapeError
from ..nn.module import Module
from ..nn.normalization import _BatchNorm
from ..tensor import Tensor, cat, float32, float64, full
from ..tensor.tensor import _needs_grad, _record
from .comm import Communicator


def all_reduce_sum(tensor: Tensor, communicator: Communicator) -> Tensor:
    """The sum of ``tensor`` over all ranks, as a new tensor that autograd differentiates.

    Every rank's result depends on every rank's input, so the gradient each rank receives for its input is the
    sum of all ranks' output gradients: backward all-reduces the incoming gradient. All ranks must run the
    same backward (they do under ``DataParallel``: the same model on every rank).
    """
    with no_grad():
        out = tensor.detach().clone()
        communicator.all_reduce(out, "sum")
    if _needs_grad(tensor):
        def backward(g: Tensor) -> tuple[Tensor]:
            with no_grad():
                total = g.detach().clone()
                communicator.all_reduce(total, "sum")
            return (total,)

        _record(out, "AllReduceSum", (tensor,), (), backward)
    return out


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch of all ranks (any input of 2-5 dims, channels at dim 1).

    Same arguments, parameters, buffers and state-dict keys as ``nn.BatchNorm1d/2d/3d``; ``communicator``
    defaults to the one ``flowgraph.distributed.init()`` created. Build it from an existing model with
    :meth:`convert_sync_batchnorm` (``DataParallel(model, sync_batchnorm=True)`` does).

    >>> model = SyncBatchNorm.convert_sync_batchnorm(model)   # doctest: +SKIP
    """

    _expected = (2, 3, 4, 5)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, communicator: Communicator | None = None, device=None,
                 dtype=None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        object.__setattr__(self, "_comm", communicator)

    def _communicator(self) -> Communicator | None:
        if self._comm is not None:
            return self._comm
        from . import get_communicator, is_initialized

        return get_communicator() if is_initialized() else None

    def forward(self, input: Tensor) -> Tensor:
        comm = self._communicator()
        if not self.training or comm is None or comm.world_size == 1:
            return super().forward(input)
        self._check_input(input)
        factor = self._factor()
        return sync_batch_norm(input, self.running_mean if self.track_running_stats else None,
                               self.running_var if self.track_running_stats else None, self.weight, self.bias,
                               factor, self.eps, comm)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, communicator: Communicator | None = None) -> Module:
        """Replace every BatchNorm1d/2d/3d in ``module`` (or ``module`` itself) by a ``SyncBatchNorm`` that
        shares its parameters and buffers (optimizers and checkpoints keep working); returns the result."""
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            sync = cls(module.num_features, module.eps, module.momentum, module.affine,
                       module.track_running_stats, communicator)
            for name in ("weight", "bias"):
                sync._parameters[name] = module._parameters.get(name)
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                sync._buffers[name] = module._buffers.get(name)
            sync.train(module.training)
            return sync
        for name, child in list(module._modules.items()):
            if child is not None:
                module._modules[name] = cls.convert_sync_batchnorm(child, communicator)
        return module


def sync_batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
                    weight: Tensor | None, bias: Tensor | None, momentum: float, eps: float,
                    communicator: Communicator) -> Tensor:
    """Training-mode batch norm with statistics all-reduced over ``communicator``'s ranks (see the module doc).

    Per channel: ``sum(x)``, ``sum(x * x)`` and the element count are all-reduced in one collective; the
    biased variance normalises, the unbiased one updates ``running_var``, as PyTorch does.
    """
    if input.ndim < 2:
        raise ShapeError(f"sync_batch_norm: expected an input of at least 2 dims (N, C, ...), got {input.shape}")
    c = input.shape[1]
    axes = (0, *range(2, input.ndim))
    local = 1
    for a in axes:
        local *= input.shape[a]
    if local * communicator.world_size <= 1:
        raise FlowError(f"sync_batch_norm: expected more than 1 value per channel over all ranks, got input shape "
                        f"{input.shape} on each of {communicator.world_size} rank(s)")
    stats_dtype = float64 if input.dtype == float64 else float32  # float16 inputs: float32 statistics
    x = input if input.dtype == stats_dtype else input.to(stats_dtype)
    count = full((1,), float(local), dtype=stats_dtype, device=input.device)
    packed = all_reduce_sum(cat([x.sum(axes), (x * x).sum(axes), count]), communicator)
    n = packed[2 * c:].detach()  # the global count: no host read, so a captured step can contain it
    mean = packed[:c] / n
    var = packed[c:2 * c] / n - mean * mean
    shape = (1, c) + (1,) * (input.ndim - 2)
    y = (x - mean.reshape(shape)) * (var.reshape(shape) + eps).rsqrt()
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    if running_mean is not None and running_var is not None:
        with no_grad():
            unbiased = var.detach() * (n / (n - 1).clamp(min=1))
            running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.dtype) * momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype) * momentum)
    return y if y.dtype == input.dtype else y.to(input.dtype)

