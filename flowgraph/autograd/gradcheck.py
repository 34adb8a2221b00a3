"""``gradcheck``: compare autograd's gradients with float64 central finite differences."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import FlowError, GradcheckError
from .grad_mode import no_grad


def gradcheck(fn: Callable, inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              seed: int = 0, raise_exception: bool = True) -> bool:
    """Check ``fn``'s gradients with respect to every floating input that requires grad.

    For a random projection ``v`` of the outputs, the analytic vector-Jacobian product from one backward
    pass is compared with central differences of ``<v, fn(x)>`` element by element. Inputs should be
    float64. On a mismatch raises ``fg.GradcheckError`` naming the op that produced the output, the input,
    the element and both values (or returns False with ``raise_exception=False``).
    """
    from ..tensor import Tensor, tensor

    if not callable(fn):
        raise FlowError(f"gradcheck: fn must be callable (called as fn(*inputs)), got "
                             f"{type(fn).__name__} {fn!r:.40}")
    if isinstance(inputs, Tensor):
        inputs = (inputs,)
    inputs = tuple(inputs)
    rng = np.random.default_rng(seed)

    def outputs_of(args) -> list:
        out = fn(*args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o for o in outs if isinstance(o, Tensor) and o.dtype.is_floating_point]

    outs = outputs_of(inputs)
    projections = [rng.standard_normal(o.shape) for o in outs]
    total = None
    for o, v in zip(outs, projections):
        if not o.requires_grad:
            continue
        term = (o * tensor(v, dtype=o.dtype, device=o.device)).sum()
        total = term if total is None else total + term
    targets = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if total is None:
        analytic = [np.zeros(inputs[i].shape) for i in targets]
        op_name = "(no differentiable output)"
    else:
        from .functional import grad

        grads = grad(total, [inputs[i] for i in targets], allow_unused=True)
        analytic = [np.zeros(inputs[i].shape) if g is None else g.detach().numpy().astype(np.float64)
                    for i, g in zip(targets, grads)]
        op_name = next((o.grad_fn.name for o in outs if o.grad_fn is not None), "?")

    def objective(args) -> float:
        with no_grad():
            vals = outputs_of(args)
        return float(sum(float((o.detach().numpy().astype(np.float64) * v).sum()) for o, v in zip(vals, projections)))

    for k, i in zip(range(len(targets)), targets):
        x = inputs[i]
        base = x.detach().numpy().astype(np.float64)
        numeric = np.zeros_like(base)
        flat = base.reshape(-1)
        for j in range(flat.size):
            saved = flat[j]
            values = []
            for sign in (1, -1):
                flat[j] = saved + sign * eps
                args = list(inputs)
                args[i] = tensor(base.copy(), dtype=x.dtype, device=x.device)
                values.append(objective(args))
            flat[j] = saved
            numeric.reshape(-1)[j] = (values[0] - values[1]) / (2 * eps)
        a = analytic[k]
        bad = ~np.isclose(a, numeric, rtol=rtol, atol=atol)
        if bad.any():
            idx = tuple(int(v) for v in np.argwhere(bad)[0])
            msg = (f"gradcheck failed for {op_name}: input {i}, element {idx}: analytic {a[idx]:.8g} vs "
                   f"numerical {numeric[idx]:.8g} (atol={atol}, rtol={rtol})")
            if raise_exception:
                raise GradcheckError(msg)
            return False
    return True
