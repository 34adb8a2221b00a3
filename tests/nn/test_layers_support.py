"""Shared harness for the layer tests (no tests of its own).

``compare_with_torch`` builds nothing itself: it takes a flowgraph module and the same torch module, copies
torch's ``state_dict`` into flowgraph through numpy (the keys must be identical, in the same order), runs
both on the same float32 inputs for one or more steps, and compares the output, every floating input's
gradient, every parameter's gradient and, after each step, every buffer.

``gradcheck_module`` runs ``fg.gradcheck`` (float64 central differences) with respect to a module's floating
inputs and all of its parameters, by substituting the perturbed tensors for the parameters during the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

import flowgraph as fg

RTOL, ATOL = 1e-5, 1e-5  # the default float32 tolerance of every torch comparison; cases may state their own


def host(t) -> np.ndarray:
    """A flowgraph or torch tensor as a numpy array."""
    if isinstance(t, torch.Tensor):
        return t.detach().cpu().numpy()
    return t.detach().to("cpu").numpy()


def skip_if_no_float64(device: str) -> None:
    """Skip (with the reason) on a backend without float64."""
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} has no float64: gradcheck needs it")


@dataclass
class Case:
    """One module configuration: ``cls(*args, **kwargs)`` in both libraries, fed ``inputs(rng)``."""

    id: str
    cls: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    inputs: Callable[[np.random.Generator], list[np.ndarray]] | None = None
    rtol: float = RTOL
    atol: float = ATOL
    steps: int = 1  # forward/backward steps in train mode (buffers compared after each)
    eval_step: bool = False  # one more step in eval mode
    gradcheck_inputs: Callable[[np.random.Generator], list[np.ndarray]] | None = None  # small float64 inputs

    def build(self, lib):
        """The module from ``flowgraph.nn`` or ``torch.nn``."""
        return getattr(lib, self.cls)(*self.args, **self.kwargs)


def floats(*shape: int, scale: float = 1.0, offset: float = 0.0):
    """An ``inputs`` factory: one standard-normal float32 array of ``shape``."""
    return lambda rng: [(rng.standard_normal(shape) * scale + offset).astype(np.float32)]


def ints(high: int, *shape: int):
    """An ``inputs`` factory: one int64 array of values in ``[0, high)``."""
    return lambda rng: [rng.integers(0, high, shape).astype(np.int64)]


def randomize_parameters(t_mod: torch.nn.Module, seed: int = 0) -> None:
    """Replace torch's parameters by U(-1, 1) values so constant inits (norm weights = 1) test something."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in t_mod.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) * 2 - 1)


def copy_torch_weights(f_mod, t_mod: torch.nn.Module, device: str) -> None:
    """Load torch's state dict into the flowgraph module (same keys, same order) and move it to ``device``."""
    t_state = t_mod.state_dict()
    assert list(f_mod.state_dict()) == list(t_state), "state_dict keys differ from PyTorch's"
    result = f_mod.load_state_dict({k: v.detach().numpy() for k, v in t_state.items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    f_mod.to(device)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def compare_with_torch(
    f_mod,
    t_mod,
    make_inputs,
    device: str,
    rtol: float = RTOL,
    atol: float = ATOL,
    steps: int = 1,
    eval_step: bool = False,
    seed: int = 0,
) -> None:
    """Forward, input gradients, parameter gradients and buffers of ``f_mod`` against ``t_mod``."""
    rng = np.random.default_rng(seed)
    copy_torch_weights(f_mod, t_mod, device)
    t_params = dict(t_mod.named_parameters())
    modes = [True] * steps + ([False] if eval_step else [])
    for step, training in enumerate(modes):
        t_mod.train(training)
        f_mod.train(training)
        arrays = make_inputs(rng)
        t_in = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
        f_in = [fg.tensor(a, device=device, requires_grad=a.dtype.kind == "f") for a in arrays]
        t_out = _first(t_mod(*t_in))
        f_out = _first(f_mod(*f_in))
        where = f"step {step} ({'train' if training else 'eval'})"
        assert tuple(f_out.shape) == tuple(t_out.shape), f"{where}: output shape"
        np.testing.assert_allclose(host(f_out), host(t_out), rtol=rtol, atol=atol, err_msg=f"{where}: output")
        if not t_out.requires_grad:
            continue
        upstream = rng.standard_normal(tuple(t_out.shape)).astype(np.float32)
        t_out.backward(torch.tensor(upstream))
        f_out.backward(fg.tensor(upstream, device=device))
        for i, (a, b) in enumerate(zip(f_in, t_in)):
            if b.requires_grad:
                np.testing.assert_allclose(
                    host(a.grad), host(b.grad), rtol=rtol, atol=atol, err_msg=f"{where}: gradient of input {i}"
                )
        f_params = dict(f_mod.named_parameters())
        assert list(f_params) == list(t_params)
        for name, tp in t_params.items():
            fp = f_params[name]
            if tp.grad is None:
                assert fp.grad is None, f"{where}: {name} got a gradient torch does not have"
                continue
            np.testing.assert_allclose(
                host(fp.grad), host(tp.grad), rtol=rtol, atol=atol, err_msg=f"{where}: gradient of parameter {name}"
            )
            tp.grad = None
            fp.grad = None
        t_state = t_mod.state_dict()
        for name, value in f_mod.state_dict().items():
            np.testing.assert_allclose(
                host(value), host(t_state[name]), rtol=rtol, atol=atol, err_msg=f"{where}: state {name} after the step"
            )


def gradcheck_module(mod, inputs: Sequence, before_call: Callable[[], None] | None = None) -> bool:
    """``fg.gradcheck`` of ``mod(*inputs)`` with respect to its floating inputs and every parameter."""
    slots = [(m, name) for m in mod.modules() for name, p in m._parameters.items() if p is not None and p.requires_grad]
    params = [m._parameters[name].detach().clone().requires_grad_(True) for m, name in slots]
    originals = [m._parameters[name] for m, name in slots]
    k = len(inputs)

    def fn(*args):
        for (m, name), p in zip(slots, args[k:]):
            m._parameters[name] = p
        try:
            if before_call is not None:
                before_call()
            return _first(mod(*args[:k]))
        finally:
            for (m, name), p in zip(slots, originals):
                m._parameters[name] = p

    return fg.gradcheck(fn, tuple(inputs) + tuple(params))
