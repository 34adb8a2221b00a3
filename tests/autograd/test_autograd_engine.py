"""The backward engine: accumulation, retain_graph, grad modes, hooks, retain_grad, autograd.grad (also second
derivatives), detach, gradcheck's failure report, anomaly detection, and very long graphs."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import flowgraph as fg
from flowgraph.tensor.tensor import _record, _wrap


def _has_dtype(device, dtype) -> bool:
    try:
        fg.zeros(1, dtype=dtype, device=device).tolist()
        return True
    except fg.BackendError:  # e.g. float16 on an OpenCL device without cl_khr_fp16
        return False


def _close(a, b, rtol=1e-5, atol=1e-6):
    a = a.detach().numpy() if isinstance(a, fg.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_backward_accumulates_into_grad(device):
    x = fg.tensor([1.0, 2.0, 3.0], requires_grad=True, device=device)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    _close(x.grad, [2.0, 4.0, 6.0])
    y.backward()
    _close(x.grad, [4.0, 8.0, 12.0])
    (x * 3).sum().backward()
    _close(x.grad, [7.0, 11.0, 15.0])
    assert x.grad.requires_grad is False and x.grad.is_leaf
    x.grad = None
    (x.sum() * 2).backward()
    _close(x.grad, [2.0, 2.0, 2.0])


def test_second_backward_without_retain_graph_is_a_clear_error(device):
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(fg.FlowError, match="retain_graph=True"):
        y.backward()


def test_backward_argument_errors(device):
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    with pytest.raises(fg.FlowError, match="single-element"):
        (x * 2).backward()
    (x * 2).backward(fg.tensor([1.0, 0.5], device=device))
    _close(x.grad, [2.0, 1.0])
    with pytest.raises(fg.FlowError, match="shape"):
        (x * 2).backward(fg.ones(3, device=device))
    with pytest.raises(fg.FlowError, match="does not require grad"):
        fg.tensor([1.0], device=device).sum().backward()


def test_shared_subexpressions_and_broadcast(device):
    x = fg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True, device=device)
    b = fg.tensor([0.5, -1.0], requires_grad=True, device=device)
    tx = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    tb = torch.tensor([0.5, -1.0], requires_grad=True)
    h, th = x * b + b, tx * tb + tb
    (h * h.sigmoid() + h).mean().backward()
    (th * th.sigmoid() + th).mean().backward()
    _close(x.grad, tx.grad)
    _close(b.grad, tb.grad)


def test_no_grad_enable_grad_set_grad_enabled(device):
    x = fg.ones(2, requires_grad=True, device=device)
    with fg.no_grad():
        assert not fg.is_grad_enabled()
        y = x * 2
        with fg.enable_grad():
            z = x * 2
        assert not fg.is_grad_enabled()
    assert fg.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad and z.grad_fn is not None

    @fg.no_grad()
    def f(t):
        return t * 3

    assert not f(x).requires_grad and fg.is_grad_enabled()
    with fg.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert fg.is_grad_enabled()
    fg.set_grad_enabled(False)
    try:
        assert not (x + 1).requires_grad
    finally:
        fg.set_grad_enabled(True)
    assert (x + 1).requires_grad
    with pytest.raises(ValueError):
        with fg.no_grad():
            raise ValueError("restored on error too")
    assert fg.is_grad_enabled()


def test_requires_grad_rules(device):
    x = fg.zeros(2, device=device)
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad_(False)
    assert not x.requires_grad
    with pytest.raises(fg.FlowError, match="floating"):
        fg.zeros(2, dtype=fg.int64, device=device).requires_grad_()
    with pytest.raises(fg.FlowError, match="floating"):
        fg.zeros(2, dtype=fg.bool, device=device).requires_grad_()
    for half in (fg.bfloat16, fg.float16):
        if _has_dtype(device, half):
            assert fg.zeros(2, dtype=half, device=device).requires_grad_().requires_grad
    y = fg.ones(2, requires_grad=True, device=device) * 2
    with pytest.raises(fg.FlowError, match="non-leaf"):
        y.requires_grad_(False)
    # integer results of ops on float tensors do not require grad
    w = fg.ones(3, requires_grad=True, device=device)
    assert not (w > 0).requires_grad and not w.argmax().requires_grad


def test_detach(device):
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    d = (x * 2).detach()
    assert not d.requires_grad and d.is_leaf
    (x * d).sum().backward()
    _close(x.grad, [2.0, 4.0])
    y = x * 3
    y.detach_()
    assert not y.requires_grad and y.grad_fn is None
    assert x.data.requires_grad is False and x.data.tolist() == [1.0, 2.0]


def test_hooks_on_leaf_and_nonleaf(device):
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    seen = []
    h = x * 3
    h.register_hook(lambda g: seen.append(("h", g.tolist())))
    handle = x.register_hook(lambda g: g * 10)
    (h * h).sum().backward()
    assert seen == [("h", [6.0, 12.0])]
    _close(x.grad, [180.0, 360.0])  # leaf hook replaced the gradient
    handle.remove()
    x.grad = None
    (x * 1.0).sum().backward()
    _close(x.grad, [1.0, 1.0])
    h2 = x * 2
    h2.register_hook(lambda g: g * 0)  # a non-leaf hook changes what flows further back
    h2.sum().backward()
    _close(x.grad, [1.0, 1.0])
    with pytest.raises(fg.FlowError):
        fg.zeros(2, device=device).register_hook(lambda g: g)


def test_hooked_leaf_finishes_as_soon_as_its_gradient_is_complete(device):
    x = fg.tensor([1.0, 2.0], device=device)
    w1 = fg.tensor([0.5, -1.0], requires_grad=True, device=device)
    w2 = fg.tensor([2.0, 3.0], requires_grad=True, device=device)
    events = []
    h = w1 * x  # backward reaches this node last
    h.register_hook(lambda g: events.append("h"))
    handle = w2.register_hook(lambda g: events.append(("w2", w2.grad)))
    (h.tanh() * w2).sum().backward()
    # w2's hook ran right after the node that produced its gradient, before h's node (and before .grad was set)
    assert events[0] == ("w2", None) and events[1] == "h"
    _close(w2.grad, np.tanh([0.5, -2.0]).tolist())
    handle.remove()
    assert not w2._hooks


def test_retain_grad(device):
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    h = x * x
    h.retain_grad()
    k = x * 2
    (h * 3 + k).sum().backward()
    _close(h.grad, [3.0, 3.0])
    assert k.grad is None
    _close(x.grad, [8.0, 14.0])
    x.retain_grad()  # a no-op on leaves
    assert x.grad is not None


def test_autograd_grad(device):
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    w = fg.tensor([3.0, -1.0], requires_grad=True, device=device)
    unused = fg.tensor([1.0], requires_grad=True, device=device)
    y = (x * w).sum()
    gx, gw = fg.autograd.grad(y, [x, w], retain_graph=True)
    _close(gx, [3.0, -1.0])
    _close(gw, [1.0, 2.0])
    assert x.grad is None and w.grad is None  # grad() does not accumulate
    (gx_only,) = fg.autograd.grad(y, x, retain_graph=True)
    _close(gx_only, [3.0, -1.0])
    with pytest.raises(fg.FlowError, match="allow_unused"):
        fg.autograd.grad(y, [x, unused], retain_graph=True)
    gx2, gu = fg.autograd.grad(y, [x, unused], allow_unused=True, retain_graph=True)
    assert gu is None
    h = x * w
    (gh,) = fg.autograd.grad(h, x, grad_outputs=fg.tensor([1.0, 10.0], device=device))
    _close(gh, [3.0, -10.0])
    mid = x * 2
    (gm,) = fg.autograd.grad((mid * mid).sum(), mid)  # a non-leaf input
    _close(gm, [4.0, 8.0])
    with pytest.raises(fg.FlowError, match="grad_outputs"):
        fg.autograd.grad(x * 2, x)
    with pytest.raises(fg.FlowError, match="does not require grad"):
        fg.autograd.grad(fg.ones(1, device=device).sum(), x)


def test_second_derivatives_with_create_graph(device):
    x = fg.tensor([0.5, -1.0, 2.0], requires_grad=True, device=device)
    tx = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    for f, tf in ((lambda a: a**3, lambda a: a**3), (fg.tanh, torch.tanh), (fg.sigmoid, torch.sigmoid),
                  (lambda a: a.exp() * a.sin(), lambda a: a.exp() * a.sin()), (fg.gelu, torch.nn.functional.gelu),
                  (lambda a: a.softmax(0) * a, lambda a: a.softmax(0) * a)):
        (g,) = fg.autograd.grad(f(x).sum(), x, create_graph=True)
        (tg,) = torch.autograd.grad(tf(tx).sum(), tx, create_graph=True)
        _close(g, tg)
        assert g.requires_grad
        (gg,) = fg.autograd.grad(g.sum(), x)
        (tgg,) = torch.autograd.grad(tg.sum(), tx)
        _close(gg, tgg, rtol=1e-4, atol=1e-5)
    # backward(create_graph=True) leaves a differentiable .grad
    y = (x**3).sum()
    y.backward(create_graph=True)
    assert x.grad.requires_grad
    x.grad.sum().backward()


def test_backward_with_inputs(device):
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    w = fg.tensor([3.0, 4.0], requires_grad=True, device=device)
    (x * w).sum().backward(inputs=[x])
    _close(x.grad, [3.0, 4.0])
    assert w.grad is None


def test_graph_introspection(device):
    x = fg.ones(2, requires_grad=True, device=device)
    y = (x * 2).exp()
    assert y.grad_fn.name == "Exp" and not y.is_leaf
    assert y.grad_fn.next_functions[0][0].name == "Mul"
    assert "ExpBackward" in repr(y.grad_fn)


def test_gradcheck_passes_and_rejects_wrong_backward(device):
    if not fg.get_backend(device).supports_float64:
        pytest.skip(f"{device} does not support float64")
    x = fg.tensor([[0.3, -1.2], [2.0, 0.7]], dtype=fg.float64, requires_grad=True, device=device)
    assert fg.gradcheck(lambda a: (a * a).sum(1), [x])

    def wrong_square(a):
        out = _wrap(a._backend.mul(a._data, a._data), a._backend)
        if a.requires_grad:
            _record(out, "WrongSquare", (a,), (a,), lambda g, a: (g * a.detach() * 3.0,))  # should be 2 * a
        return out

    with pytest.raises(fg.GradcheckError, match=r"WrongSquare.*input 0.*element \(0, 0\)"):
        fg.gradcheck(wrong_square, [x])
    with pytest.raises(AssertionError):  # GradcheckError is an AssertionError
        fg.gradcheck(wrong_square, x)
    assert fg.gradcheck(wrong_square, [x], raise_exception=False) is False
    # inputs that do not require grad are left alone; a function with no differentiable output passes
    c = fg.tensor([1.0, 2.0], dtype=fg.float64, device=device)
    assert fg.gradcheck(lambda a, b: a.sum() * b, [x, c])
    assert fg.gradcheck(lambda a: (a > 0).sum(), [x])


def test_detect_anomaly_names_forward_op(device):
    x = fg.tensor([1.0, -1.0], requires_grad=True, device=device)
    with fg.detect_anomaly():
        with pytest.raises(fg.AnomalyError, match="Log"):
            x.log()
        with pytest.raises(fg.AnomalyError, match="Sqrt"):
            (x * 1.0).sqrt()
        ok = (x * 2).exp()
        assert ok.requires_grad
    x.log()  # NaN allowed again outside the block


def test_detect_anomaly_names_backward_op(device):
    x = fg.tensor([0.0, 1.0], requires_grad=True, device=device)
    y = x.sqrt()  # forward fine; backward divides by 0 at x = 0
    with fg.detect_anomaly():
        with pytest.raises(fg.AnomalyError, match="backward of Sqrt"):
            y.sum().backward()
    z = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    with fg.detect_anomaly():
        (z * 2).sum().backward()
    _close(z.grad, [2.0, 2.0])


def test_ten_thousand_chained_ops_backward(device):
    limit = sys.getrecursionlimit()
    x = fg.tensor([1.0, 2.0], requires_grad=True, device=device)
    h = x
    for i in range(10_000):
        h = h * 1.0001 if i % 2 else h + 0.001
    h.sum().backward()
    assert sys.getrecursionlimit() == limit
    expected = 1.0001 ** 5000
    _close(x.grad, [expected, expected], rtol=1e-4)


def test_graph_is_freed_after_backward(device):
    import gc
    import weakref

    x = fg.ones(3, requires_grad=True, device=device)
    y = x.exp()
    ref = weakref.ref(y.grad_fn)
    y.sum().backward()
    del y
    gc.collect()
    assert ref() is None


def test_leaf_grad_keeps_dtype_and_shape(device):
    if not _has_dtype(device, fg.float16):
        pytest.skip(f"{device} has no float16")
    x = fg.ones(2, 3, dtype=fg.float16, requires_grad=True, device=device)
    (x * 2).sum().backward()
    assert x.grad.dtype is fg.float16 and x.grad.shape == (2, 3)
    b = fg.ones(3, requires_grad=True, device=device)
    (fg.ones(4, 3, dtype=fg.float16, device=device) * b).sum().backward()
    assert b.grad.shape == (3,) and b.grad.dtype is fg.float32
    _close(b.grad, [4.0, 4.0, 4.0])


def test_run_backward_from_edges_lets_the_roots_go(device):
    """``run_backward_from_edges`` takes the roots' gradient edges: the same gradients as backward from the roots
    (PyTorch's), with one root tensor already freed."""
    import weakref

    from flowgraph.autograd.node import run_backward_from_edges
    from flowgraph.tensor.tensor import gradient_edge

    xn = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    xt = torch.tensor(xn, requires_grad=True)
    a, b = (xt * 2.0).exp().split(2, dim=1)
    torch.autograd.backward([a, b.sin()], [torch.ones_like(a), torch.full_like(b, 0.5)])

    x = fg.tensor(xn, device=device, requires_grad=True)
    a, b = (x * 2.0).exp().split(2, dim=1)
    roots = [gradient_edge(a), gradient_edge(b.sin())]
    ref = weakref.ref(a)
    del a, b
    assert ref() is None
    got = run_backward_from_edges(roots, [fg.ones(3, 2, device=device), fg.full((3, 2), 0.5, device=device)],
                                  capture=[x])
    _close(got[0], xt.grad)
    assert x.grad is None  # captured, not accumulated


@pytest.mark.parametrize("accumulates", [False, True], ids=["product-computed", "product-accumulated"])
@pytest.mark.parametrize("case", ["loop", "realized", "hook", "anomaly", "grad", "retain"])
def test_shared_weight_gradient_as_deferred_products(device, monkeypatch, accumulates, case):
    """A linear layer shared by every step of a loop: its parameters' gradient contributions may come back
    deferred (``MatmulGrad`` for the weight, ``ColumnSumGrad`` for the bias) for the engine to add into its own
    running sums in the kernel (``Backend.matmul_accumulate`` / ``bias_grad_accumulate``). Checked against
    torch on every path the engine can take with them: the plain loop, a loop whose output gradient arrives
    computed (a matmul's, so a lazy backend defers the bias too), a leaf hook, anomaly mode, ``autograd.grad``,
    and a second backward over a retained graph (the sum then starts from ``.grad``'s old value, which the
    engine must not write into)."""
    bk = fg.get_backend(device)
    monkeypatch.setattr(bk, "accumulates_in_place", accumulates)
    rng = np.random.default_rng(0)
    w0, x0 = rng.standard_normal((6, 6)), rng.standard_normal((3, 6))
    lin = fg.nn.Linear(6, 6).to(device=device, dtype=fg.float64)
    tlin = torch.nn.Linear(6, 6).double()
    with fg.no_grad(), torch.no_grad():
        lin.weight.copy_(fg.tensor(w0, device=device))
        tlin.weight.copy_(torch.tensor(w0))
        tlin.bias.copy_(torch.tensor(lin.bias.detach().numpy()))
    x, tx = fg.tensor(x0, device=device), torch.tensor(x0)

    m0 = rng.standard_normal((6, 6)) / 3

    def run(f, v):
        mix = fg.tensor(m0, device=device) if isinstance(v, fg.Tensor) else torch.tensor(m0)
        h = v
        for _ in range(5):
            h = (f(h) @ mix if case == "realized" else f(h)).tanh()
        return h.sum()

    if case == "hook":
        lin.weight.register_hook(lambda g: g * 2)
        tlin.weight.register_hook(lambda g: g * 2)
    if case == "grad":
        (gw,) = fg.autograd.grad(run(lin, x), [lin.weight])
        (tgw,) = torch.autograd.grad(run(tlin, tx), [tlin.weight])
        _close(gw, tgw, rtol=1e-10, atol=1e-12)
        return
    if case == "anomaly":
        with fg.autograd.detect_anomaly():
            run(lin, x).backward()
    elif case == "retain":
        loss, tloss = run(lin, x), run(tlin, tx)
        loss.backward(retain_graph=True)
        first = lin.weight.grad.detach().numpy().copy()
        loss.backward()
        tloss.backward(retain_graph=True)
        tloss.backward()
        _close(first * 2, tlin.weight.grad, rtol=1e-10, atol=1e-12)
    else:
        run(lin, x).backward()
    if case != "retain":
        run(tlin, tx).backward()
    _close(lin.weight.grad, tlin.weight.grad, rtol=1e-10, atol=1e-12)
    _close(lin.bias.grad, tlin.bias.grad, rtol=1e-10, atol=1e-12)
