"""Every differentiable op through ``fg.gradcheck`` in float64: one table, one parametrised test.

``test_every_op_has_a_gradcheck_entry`` lists flowgraph's functional API and fails for any function that is
neither in ``OPS`` nor in ``NOT_DIFFERENTIABLE``: a new op without a gradient check is obvious.
"""

from __future__ import annotations

import importlib
import inspect
import math

import numpy as np
import pytest
import torch

import flowgraph as fg

# ``import flowgraph.tensor as m`` would give fg.tensor, the creation function that shadows the module name
fgt_module = importlib.import_module("flowgraph.tensor")


def _x(shape, seed=0, low=-2.0, high=2.0, away_from=None):
    """float64 values; ``away_from`` keeps them at least 0.2 from that point (kinks)."""
    v = np.random.default_rng(seed).uniform(low, high, size=shape)
    if away_from is not None:
        v = np.where(np.abs(v - away_from) < 0.2, v + 0.4 * np.sign(v - away_from + 1e-9), v)
    return v


def _c(value, like):
    """A constant (no grad) on ``like``'s device, float64 for float values."""
    arr = np.asarray(value)
    return fg.tensor(arr, dtype=fg.float64 if arr.dtype.kind == "f" else None, device=like.device)


def _idx(shape, high, seed=0):
    return np.random.default_rng(seed).integers(0, high, size=shape)


# name -> (function of the tensors, list of (numpy array, requires_grad))
OPS = {
    # arithmetic
    "add": (lambda a, b: a + b, [_x((2, 3)), _x((3,), 1)]),
    "add_scalar": (lambda a: 2.5 + a, [_x((2, 3))]),
    "add_alpha": (lambda a, b: fg.add(a, b, alpha=-1.5), [_x((2, 3)), _x((2, 1), 1)]),
    "sub": (lambda a, b: a - b, [_x((2, 1, 3)), _x((4, 1), 1)]),
    "rsub_scalar": (lambda a: 1.0 - a, [_x((3,))]),
    "mul": (lambda a, b: a * b, [_x((2, 3)), _x((2, 1), 1)]),
    "mul_0d": (lambda a, b: a * b, [_x((2, 3)), _x((), 1)]),
    "div": (lambda a, b: a / b, [_x((2, 3)), _x((3,), 1, 0.5, 2.0)]),
    "rdiv_scalar": (lambda a: 2.0 / a, [_x((3,), 0, 0.5, 2.0)]),
    "pow": (lambda a, b: a**b, [_x((2, 3), 0, 0.5, 2.0), _x((2, 3), 1)]),
    "pow_scalar": (lambda a: a**3, [_x((2, 3))]),
    "pow_fraction": (lambda a: a**0.5, [_x((2, 3), 0, 0.5, 2.0)]),
    "rpow_scalar": (lambda a: 2.0**a, [_x((2, 3))]),
    "neg": (lambda a: -a, [_x((2, 3))]),
    "maximum": (fg.maximum, [_x((2, 3)), _x((3,), 1)]),
    "minimum": (fg.minimum, [_x((2, 3)), _x((2, 1), 1)]),
    "atan2": (fg.atan2, [_x((2, 3)), _x((2, 3), 1, 0.5, 2.0)]),
    "remainder": (fg.remainder, [_x((2, 3), 0, 0.1, 0.9), _x((2, 3), 1, 1.1, 2.0)]),
    "fmod": (fg.fmod, [_x((2, 3), 0, 0.1, 0.9), _x((2, 3), 1, 1.1, 2.0)]),
    "lerp": (lambda a, b: fg.lerp(a, b, 0.3), [_x((2, 3)), _x((2, 3), 1)]),
    "addcmul": (lambda a, b, c: fg.addcmul(a, b, c, value=0.7), [_x((2, 3)), _x((3,), 1), _x((2, 1), 2)]),
    "addcdiv": (lambda a, b, c: fg.addcdiv(a, b, c, value=-1.3), [_x((2, 3)), _x((3,), 1), _x((2, 1), 2, 0.5, 2.0)]),
    "where": (lambda a, b: fg.where(_c(_x((2, 3), 5) > 0, a), a, b), [_x((2, 3)), _x((3,), 1)]),
    "where_scalar": (lambda a: fg.where(_c(_x((2, 3), 5) > 0, a), a, 0.5), [_x((2, 3))]),
    "clamp": (lambda a: fg.clamp(a, -0.5, 0.7), [_x((3, 4), away_from=0.0)]),
    "clamp_tensor": (lambda a, lo, hi: fg.clamp(a, lo, hi), [_x((3, 4)), _x((4,), 1, -2, -1), _x((3, 1), 2, 1, 2)]),
    # unary math
    "exp": (fg.exp, [_x((2, 3))]),
    "expm1": (fg.expm1, [_x((2, 3))]),
    "log": (fg.log, [_x((2, 3), 0, 0.5, 3.0)]),
    "log1p": (fg.log1p, [_x((2, 3), 0, -0.5, 3.0)]),
    "sqrt": (fg.sqrt, [_x((2, 3), 0, 0.5, 3.0)]),
    "rsqrt": (fg.rsqrt, [_x((2, 3), 0, 0.5, 3.0)]),
    "reciprocal": (fg.reciprocal, [_x((2, 3), 0, 0.5, 3.0)]),
    "square": (fg.square, [_x((2, 3))]),
    "abs": (fg.abs, [_x((2, 3), away_from=0.0)]),
    "sin": (fg.sin, [_x((2, 3))]),
    "cos": (fg.cos, [_x((2, 3))]),
    "tan": (fg.tan, [_x((2, 3), 0, -1.0, 1.0)]),
    "tanh": (fg.tanh, [_x((2, 3))]),
    "sigmoid": (fg.sigmoid, [_x((2, 3))]),
    "relu": (fg.relu, [_x((2, 3), away_from=0.0)]),
    "gelu": (fg.gelu, [_x((2, 3))]),
    "gelu_tanh": (lambda a: fg.gelu(a, approximate="tanh"), [_x((2, 3))]),
    "silu": (fg.silu, [_x((2, 3))]),
    "softplus": (fg.softplus, [_x((2, 3))]),
    "softplus_beta": (lambda a: fg.softplus(a, beta=2.0, threshold=3.0), [_x((2, 3), away_from=1.5)]),
    "erf": (fg.erf, [_x((2, 3))]),
    "sign": (fg.sign, [_x((2, 3), away_from=0.0)]),
    "floor": (fg.floor, [_x((2, 3), away_from=0.0) + 0.5]),
    "ceil": (fg.ceil, [_x((2, 3), away_from=0.0) + 0.5]),
    "round": (fg.round, [_x((2, 3), away_from=0.0) + 0.25]),
    "trunc": (fg.trunc, [_x((2, 3), away_from=0.0) + 0.25]),
    # reductions
    "sum": (lambda a: a.sum(), [_x((2, 3))]),
    "sum_dim": (lambda a: a.sum((0, 2), keepdim=True), [_x((2, 3, 2))]),
    "mean": (lambda a: a.mean(1), [_x((2, 3))]),
    "var": (lambda a: a.var(1), [_x((2, 3))]),
    "var_all": (lambda a: a.var(correction=0), [_x((2, 3))]),
    "std": (lambda a: a.std(0, keepdim=True), [_x((3, 2))]),
    "var_mean": (lambda a: (lambda v, m: v * 2.0 + m)(*fg.var_mean(a, 1, correction=0)), [_x((2, 3))]),
    "amax": (lambda a: a.amax(1), [_x((2, 4))]),
    "amin": (lambda a: a.amin((0, 1)), [_x((2, 4))]),
    "max_all": (lambda a: a.max(), [_x((2, 4))]),
    "min_all": (lambda a: a.min(), [_x((2, 4))]),
    "max_dim": (lambda a: a.max(1).values, [_x((2, 4))]),
    "min_dim": (lambda a: a.min(0, keepdim=True).values, [_x((3, 2))]),
    "prod": (lambda a: a.prod(), [_x((2, 3))]),
    "prod_dim": (lambda a: a.prod(1, keepdim=True), [_x((2, 3))]),
    "prod_with_zero": (lambda a: (a * _c([[1.0, 0.0, 1.0]], a)).prod(1), [_x((2, 3))]),
    "logsumexp": (lambda a: a.logsumexp(1), [_x((2, 3))]),
    "softmax": (lambda a: a.softmax(-1), [_x((2, 3))]),
    "log_softmax": (lambda a: a.log_softmax(0), [_x((2, 3))]),
    "cumsum": (lambda a: a.cumsum(1), [_x((2, 3))]),
    "cumprod": (lambda a: a.cumprod(1), [_x((2, 3))]),
    "norm": (lambda a: a.norm(), [_x((2, 3))]),
    "norm_dim": (lambda a: a.norm(dim=1), [_x((2, 3))]),
    "norm1": (lambda a: a.norm(p=1, dim=0), [_x((2, 3), away_from=0.0)]),
    "norm3": (lambda a: a.norm(p=3), [_x((2, 3), away_from=0.0)]),
    "norm_inf": (lambda a: a.norm(p=math.inf), [_x((2, 3))]),
    # shape
    "reshape": (lambda a: a.reshape(3, 2), [_x((2, 3))]),
    "view": (lambda a: a.view(-1), [_x((2, 3))]),
    "permute": (lambda a: a.permute(2, 0, 1), [_x((2, 3, 2))]),
    "transpose": (lambda a: a.transpose(0, 1), [_x((2, 3))]),
    "t": (lambda a: a.t(), [_x((2, 3))]),
    "squeeze": (lambda a: a.squeeze(1), [_x((2, 1, 3))]),
    "unsqueeze": (lambda a: a.unsqueeze(-1), [_x((2, 3))]),
    "flatten": (lambda a: a.flatten(1), [_x((2, 3, 2))]),
    "unflatten": (lambda a: a.unflatten(1, (3, 2)), [_x((2, 6))]),
    "expand": (lambda a: a.expand(2, 3, 4), [_x((3, 1))]),
    "expand_as": (lambda a: a.expand_as(fg.zeros(2, 3, dtype=fg.float64, device=a.device)), [_x((3,))]),
    "broadcast_to": (lambda a: fg.broadcast_to(a, (2, 3)), [_x((1, 3))]),
    "broadcast_tensors": (lambda a, b: fg.broadcast_tensors(a, b)[0] * fg.broadcast_tensors(a, b)[1],
                          [_x((3, 1)), _x((2,), 1)]),
    "repeat": (lambda a: a.repeat(2, 1, 3), [_x((2, 2))]),
    "repeat_interleave": (lambda a: a.repeat_interleave(2, dim=0), [_x((2, 2))]),
    "cat": (lambda a, b: fg.cat([a, b], 1), [_x((2, 3)), _x((2, 1), 1)]),
    "stack": (lambda a, b: fg.stack([a, b], -1), [_x((2, 3)), _x((2, 3), 1)]),
    "split": (lambda a: fg.split(a, [1, 2], 1)[1] * 2 + fg.split(a, 2, 1)[0].sum(), [_x((2, 3))]),
    "chunk": (lambda a: a.chunk(2, 0)[1], [_x((3, 2))]),
    "unbind": (lambda a: a.unbind(1)[2], [_x((2, 3))]),
    "flip": (lambda a: a.flip((0, 1)), [_x((2, 3))]),
    "roll": (lambda a: a.roll((1, -1), (0, 1)), [_x((2, 3))]),
    "narrow": (lambda a: a.narrow(1, 1, 2), [_x((2, 3))]),
    "movedim": (lambda a: a.movedim(0, 2), [_x((2, 3, 2))]),
    "contiguous": (lambda a: a.t().contiguous(), [_x((2, 3))]),
    "clone": (lambda a: a.clone(), [_x((2, 3))]),
    "pad_constant": (lambda a: fg.pad(a, (1, 2, 0, 1), value=0.5), [_x((2, 3))]),
    "pad_crop": (lambda a: fg.pad(a, (-1, 1)), [_x((2, 3))]),
    "pad_reflect": (lambda a: fg.pad(a, (2, 1), mode="reflect"), [_x((2, 4))]),
    "pad_replicate": (lambda a: fg.pad(a, (2, 1), mode="replicate"), [_x((2, 3))]),
    "pad_circular": (lambda a: fg.pad(a, (1, 2), mode="circular"), [_x((2, 3))]),
    # indexing
    "getitem_basic": (lambda a: a[1:, ::2], [_x((3, 4))]),
    "getitem_negative_step": (lambda a: a[::-1, 1], [_x((3, 4))]),
    "getitem_int": (lambda a: a[1], [_x((3, 4))]),
    "getitem_none_ellipsis": (lambda a: a[None, ..., 0], [_x((3, 4))]),
    "getitem_advanced": (lambda a: a[_c([0, 2, 2], a)], [_x((3, 4))]),
    "getitem_two_advanced": (lambda a: a[_c([0, 2, 2], a), _c([1, 1, 3], a)], [_x((3, 4))]),
    "getitem_adv_middle": (lambda a: a[:, _c([[0, 1], [2, 0]], a)], [_x((2, 3))]),
    "getitem_mask": (lambda a: a[_c(_x((3, 4), 3) > 0, a)], [_x((3, 4))]),
    "setitem": (lambda a, v: _setitem(a, v), [_x((3, 4)), _x((2,), 1)]),
    "gather": (lambda a: fg.gather(a, 1, _c(_idx((3, 2), 4), a)), [_x((3, 4))]),
    "take_along_dim": (lambda a: fg.take_along_dim(a, _c(_idx((3, 1), 4), a), 1), [_x((3, 4))]),
    "scatter": (lambda a, s: fg.scatter(a, 1, _c([[0, 2], [3, 1], [1, 0]], a), s), [_x((3, 4)), _x((3, 2), 1)]),
    "scatter_add": (lambda a, s: fg.scatter_add(a, 0, _c(_idx((2, 4), 3), a), s), [_x((3, 4)), _x((2, 4), 1)]),
    "index_select": (lambda a: fg.index_select(a, 0, _c([2, 0, 2], a)), [_x((3, 4))]),
    "index_add": (lambda a, s: fg.index_add(a, 1, _c([0, 3, 0], a), s), [_x((2, 4)), _x((2, 3), 1)]),
    "masked_fill": (lambda a: fg.masked_fill(a, _c(_x((3, 4), 4) > 0, a), 0.5), [_x((3, 4))]),
    "masked_select": (lambda a: fg.masked_select(a, _c(_x((3, 4), 4) > 0, a)), [_x((3, 4))]),
    # triangles, diagonals, sorting (flowgraph/tensor/extra.py)
    "tril": (lambda a: a.tril(-1), [_x((3, 4))]),
    "triu_": (lambda a: (a * 1.0).triu_(1), [_x((3, 4))]),
    "triu": (lambda a: fg.triu(a, 1), [_x((2, 3, 3))]),
    "diagonal": (lambda a: a.diagonal(1, 0, 1), [_x((3, 4))]),
    "diag_of_vector": (lambda a: fg.diag(a, -1), [_x((3,))]),
    "diag_of_matrix": (lambda a: fg.diag(a), [_x((3, 3))]),
    "trace": (lambda a: fg.trace(a), [_x((3, 3))]),
    "sort": (lambda a: fg.sort(a, dim=1, descending=True)[0], [_x((2, 4))]),
    "topk": (lambda a: fg.topk(a, 2, dim=-1)[0], [_x((3, 4))]),
    "nan_to_num": (lambda a: fg.nan_to_num(fg.where(_c([[False, True, False]], a), float("inf"), a), posinf=3.0,
                                           neginf=-3.0), [_x((2, 3))]),
    # linear algebra
    "matmul": (lambda a, b: a @ b, [_x((2, 3)), _x((3, 4), 1)]),
    "matmul_batched_broadcast": (lambda a, b: a @ b, [_x((2, 1, 2, 3)), _x((3, 3, 2), 1)]),
    "matmul_vec": (lambda a, b: a @ b, [_x((3,)), _x((2, 3, 2), 1)]),
    "mm": (fg.mm, [_x((2, 3)), _x((3, 2), 1)]),
    "bmm": (fg.bmm, [_x((2, 2, 3)), _x((2, 3, 2), 1)]),
    "dot": (fg.dot, [_x((3,)), _x((3,), 1)]),
    "outer": (fg.outer, [_x((3,)), _x((2,), 1)]),
    "einsum": (lambda a, b: fg.einsum("bij,bjk->bik", a, b), [_x((2, 2, 3)), _x((2, 3, 2), 1)]),
    "einsum_reduce": (lambda a, b: fg.einsum("ij,kj->k", a, b), [_x((2, 3)), _x((4, 3), 1)]),
}


def _setitem(a, v):
    h = a * 1.0
    h[1, 1:3] = v
    return h * h


#: Functions of the tensor namespace that have no gradient (integer, boolean, random or creation results).
NOT_DIFFERENTIABLE = {
    "arange", "as_tensor", "bernoulli", "empty", "empty_like", "eye", "from_dlpack", "from_numpy", "full",
    "full_like", "get_rng_state", "linspace", "manual_seed", "normal", "set_rng_state", "ones", "ones_like",
    "rand", "rand_like", "randint",
    "randint_like", "randn", "randn_like", "randperm", "tensor", "zeros", "zeros_like",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "isnan",
    "isinf", "isfinite", "argmax", "argmin", "any", "all", "count_nonzero", "nonzero", "floor_divide",
    "as_dtype", "get_default_dtype", "set_default_dtype", "promote_types", "broadcast_shapes", "sum_to",
    "apply_inplace", "getitem", "setitem", "argsort", "allclose", "isclose", "equal", "is_autocast_enabled",
    "autocast", "inference_mode", "multinomial", "unique",
}
#: Spellings that share a gradcheck entry with another name.
ALIASES = {
    "concat": "cat", "pad": "pad_constant", "diag": "diag_of_vector", "max": "max_all", "min": "min_all",
}


def test_every_op_has_a_gradcheck_entry():
    public = {
        name for name, obj in vars(fgt_module).items()
        if not name.startswith("_") and callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj)
    }
    assert {"add", "matmul", "softmax", "zeros"} <= public  # the listing itself works
    missing = sorted(n for n in public if n not in NOT_DIFFERENTIABLE and n not in OPS and n not in ALIASES)
    assert not missing, f"ops without a gradcheck entry in OPS (or a NOT_DIFFERENTIABLE listing): {missing}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradcheck(device, name):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} does not support float64")
    fn, arrays = OPS[name]
    inputs = [fg.tensor(a, dtype=fg.float64, device=device, requires_grad=True) for a in arrays]
    assert fg.gradcheck(fn, inputs)


def test_gradcheck_cast(device):
    """Cast's backward casts back: checked through float32 with a step and tolerance float32 can resolve."""
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} does not support float64")
    x = fg.tensor(_x((2, 3)), dtype=fg.float64, device=device, requires_grad=True)
    assert fg.gradcheck(lambda a: (a.to(fg.float32) * a.to(fg.float32)).to(fg.float64), [x], eps=1e-2, atol=1e-3,
                        rtol=1e-2)
    y = x.to(fg.float32)
    y.sum().backward()
    assert x.grad.dtype is fg.float64 and x.grad.tolist() == [[1.0] * 3] * 2


@pytest.mark.parametrize("name", ["mul", "div", "exp", "tanh", "softmax", "matmul", "getitem_basic", "cumsum",
                                  "sigmoid", "pow"])
def test_gradients_match_torch(device, name):
    """Analytic gradients against torch's, for a few ops, as a second opinion next to finite differences."""
    fn, arrays = OPS[name]
    inputs = [fg.tensor(a, dtype=fg.float32, device=device, requires_grad=True) for a in arrays]
    t_inputs = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in arrays]
    t_fns = {
        "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "exp": torch.exp, "tanh": torch.tanh,
        "softmax": lambda a: a.softmax(-1), "matmul": lambda a, b: a @ b, "getitem_basic": lambda a: a[1:, ::2],
        "cumsum": lambda a: a.cumsum(1), "sigmoid": torch.sigmoid, "pow": lambda a, b: a**b,
    }
    out, t_out = fn(*inputs), t_fns[name](*t_inputs)
    weight = np.random.default_rng(3).standard_normal(tuple(t_out.shape)).astype(np.float32)
    (out * fg.tensor(weight, device=device)).sum().backward()
    (t_out * torch.tensor(weight)).sum().backward()
    for a, b in zip(inputs, t_inputs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradgradcheck(device, name):
    """Second derivatives: gradcheck of the first derivative built with create_graph=True."""
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} does not support float64")
    fn, arrays = OPS[name]
    inputs = [fg.tensor(a, dtype=fg.float64, device=device, requires_grad=True) for a in arrays]
    weight = [np.random.default_rng(7).standard_normal(np.shape(fn(*inputs)))]

    def first_derivative(*args):
        # gradcheck evaluates its finite differences under no_grad on fresh tensors: record here regardless
        with fg.enable_grad():
            args = [a if a.requires_grad else a.detach().requires_grad_() for a in args]
            total = (fn(*args) * fg.tensor(weight[0], dtype=fg.float64, device=device)).sum()
            grads = fg.autograd.grad(total, args, create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    assert fg.gradcheck(first_derivative, inputs)


def _closure_values(fn, depth: int = 0):
    """Everything ``fn`` closes over, following closed-over functions (and partials) a few levels deep."""
    cells = getattr(fn, "__closure__", None) or ()
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield value
        if callable(value) and depth < 3 and not isinstance(value, type):
            yield from _closure_values(value, depth + 1)


def _graph_nodes(outputs):
    seen, stack = set(), [o.grad_fn for o in outputs if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack.extend(e[0] if type(e) is tuple else e for e in node.edges if e is not None)
    return seen


@pytest.mark.parametrize("name", sorted(OPS))
def test_backward_reads_only_what_was_saved(name):
    """No op's backward closes over a tensor or an array: what it reads comes through ``saved`` (version-checked)."""
    from flowgraph.tensor.tensor import Tensor

    fn, arrays = OPS[name]
    inputs = [fg.tensor(a, dtype=fg.float64, requires_grad=True) for a in arrays]
    out = fn(*inputs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    for node in _graph_nodes([o for o in outs if isinstance(o, Tensor)]):
        if node.backward is None:
            continue
        for value in _closure_values(node.backward):
            assert not isinstance(value, (Tensor, np.ndarray)), (
                f"{name}: the backward of {node.name} closes over a {type(value).__name__}; pass it through saved"
            )
