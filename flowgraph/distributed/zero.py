"""``ZeroRedundancyOptimizer``: optimizer state sharded across ranks (ZeRO stage 1), as PyTorch's.

Every rank holds the whole model and, after :class:`~flowgraph.distributed.DataParallel`'s backward, the whole
averaged gradient. Keeping every optimizer's state on every rank is the redundancy: here the parameters are
partitioned across the ranks (:func:`partition_parameters`, PyTorch's greedy rule), each rank builds the inner
optimizer (``optimizer_class``, any flowgraph optimizer) over its own shard only, so Adam's two moments exist once
in the job instead of once per rank, and after each rank has updated its shard the updated parameters are
broadcast from their owners so that every rank ends the step with identical parameters::

    model = dist.DataParallel(net)
    opt = dist.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optim.Adam, lr=1e-3)
    sched = optim.lr_scheduler.StepLR(opt, step_size=10)      # schedulers drive the wrapper's param_groups
    loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad(); sched.step()

Checkpoints: ``consolidate_state_dict(to=0)`` on every rank, then ``state_dict()`` on rank 0 gives the state
dict the unsharded optimizer would have; or each rank saves only its shard with ``save_sharded_state_dict(path)``
(file name: :func:`sharded_checkpoint_path`) and loads it back with ``load_sharded_state_dict(path)``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..autograd.grad_mode import no_grad
from ..errors import FlowError
from ..optim.optimizer import Optimizer, ParamsT
from ..serialization import load, save
from ..tensor import Tensor, cat, tensor, zeros
from .comm import Communicator


def partition_parameters(param_groups: list[list[Tensor]], world_size: int,
                         sizes: list[int] | None = None) -> list[list[list[Tensor]]]:
    """Assign parameters to ranks as ``torch.distributed.optim.ZeroRedundancyOptimizer`` does.

    Group by group, the group's parameters sorted by element count (largest first, ties in group order) each go
    to the rank with the fewest elements so far (ties: the lowest rank); the counts carry over from one group to
    the next. Returns ``[rank][group] -> parameters``. ``sizes`` (one count per rank) is updated in place, so a
    group added later is placed without moving the earlier ones.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise FlowError(f"partition_parameters: world_size must be an integer >= 1, got {world_size!r}")
    if sizes is None:
        sizes = [0] * world_size
    out: list[list[list[Tensor]]] = [[] for _ in range(world_size)]
    for params in param_groups:
        per_rank: list[list[Tensor]] = [[] for _ in range(world_size)]
        for p in sorted(params, key=lambda t: t.numel(), reverse=True):
            rank = sizes.index(min(sizes))
            per_rank[rank].append(p)
            sizes[rank] += p.numel()
        for rank in range(world_size):
            out[rank].append(per_rank[rank])
    return out


def sharded_checkpoint_path(path: str | os.PathLike, rank: int, world_size: int) -> str:
    """The file that rank ``rank`` of ``world_size`` writes for the sharded checkpoint ``path``.

    The rank and world size go before the suffix: ``"ckpt/optim.fg"`` -> ``"ckpt/optim.rank1-of-4.fg"``; a path
    without a suffix gets them appended: ``"ckpt/optim"`` -> ``"ckpt/optim.rank1-of-4"``.
    """
    text = os.fspath(path)
    root, ext = os.path.splitext(text)
    return f"{root}.rank{rank}-of-{world_size}{ext}"


class ZeroRedundancyOptimizer(Optimizer):
    """Wrap ``optimizer_class`` so that each rank keeps and updates the optimizer state of its shard only.

    PyTorch's ``torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, **defaults)``:
    ``params`` are tensors or param-group dicts as for any optimizer; ``defaults`` are passed to
    ``optimizer_class`` (e.g. ``lr=1e-3, betas=(0.9, 0.95)``). The parameters are partitioned across ranks by
    :func:`partition_parameters`; ``self.optim`` is the inner optimizer over this rank's shard (one group per
    group of the wrapper, possibly empty), and ``self.state`` is its state (this rank's shard only).

    ``step()`` copies the wrapper's hyper-parameters (``param_groups``: what LR schedulers change) into the
    inner optimizer, steps it, and broadcasts each rank's updated parameters from it (one collective per rank
    and dtype, flattened), so every rank ends with identical parameters. The gradients must already be the
    same on every rank (:class:`~flowgraph.distributed.DataParallel`'s backward makes them so).
    ``zero_grad()`` clears every parameter's gradient. ``communicator`` defaults to the one
    ``flowgraph.distributed.init()`` created (PyTorch's ``process_group``); every rank must make the same calls
    in the same order. PyTorch's ``parameters_as_bucket_view`` and ``overlap_with_ddp`` are accepted as False
    only.
    """

    def __init__(self, params: ParamsT, optimizer_class: type[Optimizer], communicator: Communicator | None = None,
                 parameters_as_bucket_view: bool = False, overlap_with_ddp: bool = False, **defaults: Any) -> None:
        for name, value in (("parameters_as_bucket_view", parameters_as_bucket_view),
                            ("overlap_with_ddp", overlap_with_ddp)):
            if value:
                raise FlowError(f"ZeroRedundancyOptimizer({name}=True) is not supported (PyTorch's option); leave "
                                "it False: parameters are broadcast flattened per owner and dtype after the step")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise FlowError("ZeroRedundancyOptimizer: optimizer_class must be a flowgraph optimizer class such as "
                            f"optim.Adam (the class, not an instance), got {optimizer_class!r}")
        if communicator is None:
            from . import get_communicator

            communicator = get_communicator()
        self._comm = communicator
        self.rank, self.world_size = communicator.rank, communicator.world_size
        self._sizes = [0] * self.world_size
        self._partition: list[list[list[Tensor]]] = [[] for _ in range(self.world_size)]
        self._consolidated: dict[int, Any] | None = None
        super().__init__(params, defaults)  # add_param_group (below) partitions each group
        for group in self.param_groups:
            self._place(group)
        local = [self._local_group(i) for i in range(len(self.param_groups))]
        self.optim: Optimizer = optimizer_class(local, **defaults)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)  # the inner's defaults show here

    @property  # type: ignore[override]
    def state(self) -> Any:
        """The inner optimizer's state: buffers of this rank's shard only (the base class's before it exists)."""
        return self.optim.state if "optim" in self.__dict__ else self.__dict__.get("_wrapper_state")

    @state.setter
    def state(self, value: Any) -> None:
        if "optim" in self.__dict__:
            self.optim.state = value
        else:
            self.__dict__["_wrapper_state"] = value

    # ------------------------------------------------------------------ partition
    def _place(self, group: dict[str, Any]) -> None:
        for rank, groups in enumerate(partition_parameters([group["params"]], self.world_size, self._sizes)):
            self._partition[rank].append(groups[0])

    def _local_group(self, i: int) -> dict[str, Any]:
        group = {k: v for k, v in self.param_groups[i].items() if k != "params"}
        group["params"] = self._partition[self.rank][i]
        return group

    def owner(self, p: Tensor) -> int:
        """The rank whose optimizer updates ``p``."""
        for rank, groups in enumerate(self._partition):
            if any(q is p for g in groups for q in g):
                return rank
        raise FlowError("ZeroRedundancyOptimizer.owner: this tensor is not one of the optimizer's parameters")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (as any optimizer); it is partitioned after the existing ones, which keep their owners."""
        super().add_param_group(param_group)
        if "optim" not in self.__dict__:
            return  # construction: __init__ partitions the groups once the inner optimizer can be built
        self._place(self.param_groups[-1])
        self.optim.add_param_group(self._local_group(len(self.param_groups) - 1))
        self._sync_param_groups(self.optim.param_groups[-1:], self.param_groups[-1:])

    @staticmethod
    def _sync_param_groups(src: list[dict[str, Any]], dst: list[dict[str, Any]]) -> None:
        """Copy every hyper-parameter (all but ``params``) from each group of ``src`` to the same group of
        ``dst``."""
        for s, d in zip(src, dst):
            for key, value in s.items():
                if key != "params":
                    d[key] = value

    # ------------------------------------------------------------------ stepping
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update this rank's shard with the inner optimizer, then broadcast every shard from its owner.

        Returns ``closure()``'s loss (the closure runs on every rank). Hyper-parameters changed in
        ``param_groups`` (a scheduler's ``lr``) reach the inner optimizer first; what the inner optimizer
        changes in its groups comes back.
        """
        self._sync_param_groups(self.param_groups, self.optim.param_groups)
        loss = self.optim.step(closure)
        self._sync_param_groups(self.optim.param_groups, self.param_groups)
        self._sync_params()
        return loss

    def _sync_params(self) -> None:
        """Broadcast each rank's parameters from it: per owner and (dtype, device), one flattened tensor."""
        if self.world_size == 1:
            return
        with no_grad():
            for owner, groups in enumerate(self._partition):
                runs: dict[tuple[Any, str], list[Tensor]] = {}
                for p in (p for g in groups for p in g):
                    runs.setdefault((p.dtype, p.device), []).append(p)
                for (dtype, device), params in runs.items():
                    if len(params) == 1:
                        self._comm.broadcast(params[0], owner)
                        continue
                    total = sum(p.numel() for p in params)
                    if self.rank == owner:
                        flat = cat([p.detach().reshape(-1) for p in params])
                    else:
                        flat = zeros(total, dtype=dtype, device=device)
                    self._comm.broadcast(flat, owner)
                    if self.rank != owner:
                        offset = 0
                        for p in params:
                            n = p.numel()
                            p.copy_(flat[offset:offset + n].reshape(p.shape))
                            offset += n

    # ------------------------------------------------------------------ state dicts
    def _global_index(self) -> dict[int, int]:
        """``id(parameter) -> index`` in group order: the numbering of :meth:`state_dict`."""
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _owned_indices(self) -> list[list[int]]:
        index = self._global_index()
        return [[index[id(p)] for p in params] for params in self._partition[self.rank]]

    def _local_state(self) -> dict[int, dict[str, Any]]:
        """This rank's state, keyed by global parameter index (references to the inner optimizer's buffers)."""
        index = self._global_index()
        return {index[id(p)]: s for p, s in self.optim.state.items() if id(p) in index and s}

    def _device(self) -> str:
        return next(p for g in self.param_groups for p in g["params"]).device

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collect every rank's shard of the state on rank ``to`` (call it on every rank); then
        :meth:`state_dict` on that rank returns the whole state.

        Each shard travels as the bytes of an ``fg.save`` file (safetensors: no pickle) in one broadcast per
        rank. The collected state is a snapshot: later steps do not change it.
        """
        if isinstance(to, bool) or not isinstance(to, int) or not 0 <= to < self.world_size:
            raise FlowError(f"consolidate_state_dict(to={to!r}): to must be a rank, 0..{self.world_size - 1}")
        buf = io.BytesIO()
        save(self._local_state(), buf)
        blob = buf.getvalue()
        device = self._device()
        if self.world_size == 1:
            blobs = [blob]
        else:
            lengths = self._comm.all_gather(tensor([len(blob)], dtype="int64", device=device))
            blobs = []
            for r in range(self.world_size):
                if r == self.rank:
                    payload = tensor(np.frombuffer(blob, dtype=np.uint8), device=device)
                else:
                    payload = zeros(int(lengths[r].item()), dtype="uint8", device=device)
                self._comm.broadcast(payload, r)
                blobs.append(payload.numpy().tobytes() if self.rank == to else b"")
        if self.rank != to:
            self._consolidated = None
            return
        merged: dict[int, Any] = {}
        for data in blobs:
            merged.update(load(io.BytesIO(data), map_location=device))
        self._consolidated = merged

    def state_dict(self) -> dict[str, Any]:
        """The whole state in the unsharded optimizer's format (global parameter indices), on the rank that
        :meth:`consolidate_state_dict` collected it on; a FlowError elsewhere or before consolidation."""
        if self._consolidated is None:
            raise FlowError(f"ZeroRedundancyOptimizer.state_dict() on rank {self.rank}: the optimizer state has "
                            "not been consolidated on this rank; call consolidate_state_dict(to=rank) on every "
                            "rank first (or save each rank's shard with save_sharded_state_dict(path))")
        out = super().state_dict()
        out["state"] = dict(sorted(self._consolidated.items()))
        return out

    def _check_groups(self, state_dict: Any, where: str) -> None:
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise FlowError(f"ZeroRedundancyOptimizer.{where}: expected a dict with 'state' and 'param_groups' "
                            "entries (as state_dict() or sharded_state_dict() returns)")
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise FlowError(f"ZeroRedundancyOptimizer.{where}: the state dict has "
                            f"{len(state_dict['param_groups'])} parameter groups, this optimizer has "
                            f"{len(self.param_groups)}")

    def _load_local(self, saved_groups: list[dict[str, Any]], state: dict[Any, Any],
                    owned: list[list[int]]) -> None:
        """Load ``state`` (global index -> buffers) for this rank's parameters into the inner optimizer, and the
        saved hyper-parameters into both optimizers' groups."""
        local_state, local_groups, n = {}, [], 0
        for saved, indices in zip(saved_groups, owned):
            group = {k: v for k, v in saved.items() if k != "params"}
            group["params"] = list(range(n, n + len(indices)))
            local_groups.append(group)
            for j, gidx in enumerate(indices):
                buffers = state.get(gidx, state.get(str(gidx)))
                if buffers:
                    local_state[n + j] = buffers
            n += len(indices)
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._sync_param_groups(self.optim.param_groups, self.param_groups)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a whole state dict (from :meth:`state_dict`, or from the unsharded optimizer): each rank keeps
        the state of its own shard. Works for any world size, so it also reshards."""
        self._check_groups(state_dict, "load_state_dict")
        for i, (mine, saved) in enumerate(zip(self.param_groups, state_dict["param_groups"])):
            if len(saved["params"]) != len(mine["params"]):
                raise FlowError(f"ZeroRedundancyOptimizer.load_state_dict: group {i} has {len(saved['params'])} "
                                f"parameters in the state dict and {len(mine['params'])} here")
        # The saved numbering may differ from ours: map ours through the saved group lists.
        index = self._global_index()
        saved_index = {}
        for mine, saved in zip(self.param_groups, state_dict["param_groups"]):
            for p, s in zip(mine["params"], saved["params"]):
                saved_index[index[id(p)]] = int(s)
        owned = [[saved_index[i] for i in group] for group in self._owned_indices()]
        self._load_local(state_dict["param_groups"], state_dict["state"], owned)

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's shard of the state: ``{"rank", "world_size", "state": {global index: buffers},
        "param_groups": [hyper-parameters, "params": the global indices this rank owns]}`` (buffers by
        reference). Saved by :meth:`save_sharded_state_dict`, loaded by :meth:`load_sharded_state_dict`."""
        groups = []
        for group, owned in zip(self.param_groups, self._owned_indices()):
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = owned
            groups.append(packed)
        return {"rank": self.rank, "world_size": self.world_size, "state": self._local_state(),
                "param_groups": groups}

    def save_sharded_state_dict(self, path: str | os.PathLike) -> str:
        """Write this rank's :meth:`sharded_state_dict` with ``fg.save`` to
        ``sharded_checkpoint_path(path, rank, world_size)`` (``optim.fg`` -> ``optim.rank0-of-2.fg``, ...) and
        return that file name. Every rank calls it (no collective: each writes its own file)."""
        target = sharded_checkpoint_path(path, self.rank, self.world_size)
        save(self.sharded_state_dict(), target)
        return target

    def load_sharded_state_dict(self, state_dict: dict[str, Any] | str | os.PathLike) -> None:
        """Load this rank's shard: a dict from :meth:`sharded_state_dict`, or the ``path`` given to
        :meth:`save_sharded_state_dict` (this rank's file is read). The shard must come from the same rank of
        the same world size with the same parameter groups; to change the world size, load a consolidated
        :meth:`state_dict` with :meth:`load_state_dict` instead."""
        where = "load_sharded_state_dict"
        if isinstance(state_dict, (str, os.PathLike)):
            target = sharded_checkpoint_path(state_dict, self.rank, self.world_size)
            if not os.path.exists(target):
                raise FlowError(f"ZeroRedundancyOptimizer.{where}: no shard file {target!r} for rank {self.rank} "
                                f"of {self.world_size}; save_sharded_state_dict({os.fspath(state_dict)!r}) "
                                "writes one file per rank under that name")
            state_dict = load(target, map_location=self._device())
        self._check_groups(state_dict, where)
        saved_rank, saved_world = state_dict.get("rank"), state_dict.get("world_size")
        if (saved_rank, saved_world) != (self.rank, self.world_size):
            raise FlowError(f"ZeroRedundancyOptimizer.{where}: the shard was saved by rank {saved_rank} of "
                            f"{saved_world}, this is rank {self.rank} of {self.world_size}; each rank loads its "
                            "own shard of the same world size (load a consolidated state_dict() to reshard)")
        owned = self._owned_indices()
        saved_owned = [[int(i) for i in g["params"]] for g in state_dict["param_groups"]]
        if saved_owned != owned:
            raise FlowError(f"ZeroRedundancyOptimizer.{where}: the shard holds parameters {saved_owned} but this "
                            f"rank owns {owned}; the model or its parameter groups changed since it was saved")
        self._load_local(state_dict["param_groups"], state_dict["state"], owned)


__all__ = ["ZeroRedundancyOptimizer", "partition_parameters", "sharded_checkpoint_path"]
