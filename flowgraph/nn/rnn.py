"""Recurrent layers with PyTorch's names, arguments, parameter names and formulas: ``RNN`` (tanh/relu),
``LSTM`` (optional projection), ``GRU``, and the single-step cells ``RNNCell``, ``LSTMCell``, ``GRUCell``.

A torch state dict loads directly (``weight_ih_l0``, ``weight_hh_l1_reverse``, ``weight_hr_l0`` ...).

How a layer runs: for each layer and direction the input projection of *all* time steps is one matmul
(``x @ W_ih.T + b``) before the time loop; each step then does one matmul for the hidden projection and
the gate arithmetic. The per-step views of the projection (and the gate chunks) are cut by one
autograd node whose backward writes every step's gradient into one shared buffer, so backward costs
O(L) rather than one full-size zero tensor per step.

    lstm = nn.LSTM(input_size=8, hidden_size=16, num_layers=2, batch_first=True, bidirectional=True)
    out, (h_n, c_n) = lstm(x)          # x (N, L, 8) -> out (N, L, 32), h_n/c_n (4, N, 16)
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence

from ..autograd.grad_mode import STATE, no_grad
from ..errors import FlowError, ShapeError
from ..tensor import Tensor, cat, empty, stack, zeros
from ..tensor.shape import split_views
from ..tensor.tensor import _record, _wrap
from . import init
from .dropout import dropout as _dropout
from .linear import _bias_gradient, linear
from .module import Module, Parameter

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
__functional__: list[str] = []

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


# ---------------------------------------------------------------------- splitting with an O(L) backward
def _split_views(x: Tensor, dim: int, sizes: Sequence[int], squeeze: bool = False) -> list[Tensor]:
    """``x.split(sizes, dim)`` as views with an O(L) backward (the core's ``split_views``)."""
    return split_views(x, dim, sizes, squeeze)


# ---------------------------------------------------------------------- the per-step hidden projection
class _HiddenProjection:
    """``h @ W_hh.T`` for every step of one layer direction, with ONE weight-gradient matmul.

    Each step's node returns the gradient for ``h`` and files its output gradient; a node made before
    the loop (so autograd runs it after every step) turns all of them into ``dW = G^T H`` with one
    matmul over the stacked steps, instead of one small matmul and one full-size addition per step.
    Under ``create_graph`` the steps return ordinary differentiable gradients instead.
    """

    def __init__(self, w: Tensor) -> None:
        self.w = w
        self.w_t = w.t()
        self.filed: list = []  # (output gradient, h) arrays of the steps, in backward order
        self.anchor = None
        if STATE.enabled and w.requires_grad:
            bk = w._backend
            self.token = _wrap(bk.full((), 0, w._data.dtype), bk)
            self.anchor = _record(_wrap(w._data, bk), "HiddenWeight", (w,), (), self._weight_backward)

    def _weight_backward(self, g: Tensor):
        # ``filed`` holds the steps' (output gradient, h) arrays, filed during this backward by the steps'
        # nodes from their own gradient and their saved h: no forward-time value is read here.
        if not self.filed:
            return (None if g.ndim == 0 else g,)
        bk = g._backend
        grads = _wrap(bk.concatenate([gi for gi, _ in self.filed], 0), bk)
        hs = _wrap(bk.concatenate([hi for _, hi in self.filed], 0), bk)
        self.filed.clear()
        dw = grads.t().matmul(hs)
        return (dw if g.ndim == 0 else g + dw,)

    def __call__(self, h: Tensor) -> Tensor:
        if self.anchor is None or not STATE.enabled:
            return h.matmul(self.w_t)
        bk = h._backend
        out = _wrap(bk.matmul(h._data, self.w_t._data), bk)
        need_h = h.requires_grad
        filed, token = self.filed, self.token

        def bw(g: Tensor, h: Tensor, w: Tensor):
            if STATE.enabled:  # create_graph (g itself may be a constant): differentiable gradients for both
                return (g.matmul(w) if need_h else None, g.t().matmul(h))
            filed.append((g._data, h._data))
            return (g.matmul(w.detach()) if need_h else None, token)

        return _record(out, "HiddenProjection", (h if need_h else None, self.anchor), (h, self.w), bw)


# ---------------------------------------------------------------------- one time step of each cell type
def _rnn_step(xp: Tensor, h: Tensor, project, b_hh: Tensor | None, relu: bool) -> Tensor:
    """``act(xp + h @ W_hh.T + b_hh)``; ``xp`` already holds ``x @ W_ih.T + b_ih``, ``project(h)`` is
    ``h @ W_hh.T``."""
    pre = xp + project(h)
    if b_hh is not None:
        pre = pre + b_hh
    return pre.relu() if relu else pre.tanh()


def _lstm_pieces(gates: Tensor, c: Tensor, hidden: int):
    """The LSTM pointwise values (i, f, g, o, tanh(c'), c', h') from the pre-activation gates (i, f, g, o)."""
    H = hidden
    s = gates[..., : 2 * H].sigmoid()
    i, f = s[..., :H], s[..., H:]
    g = gates[..., 2 * H: 3 * H].tanh()
    o = gates[..., 3 * H:].sigmoid()
    c_new = f * c + i * g
    tc = c_new.tanh()
    return i, f, g, o, tc, c_new, o * tc


def _lstm_pointwise(gates: Tensor, c: Tensor, hidden: int) -> tuple[Tensor, Tensor]:
    """``(h', c')`` of an LSTM step from its gates, as ONE autograd node with a closed-form backward.

    The forward runs without recording; the backward applies the LSTM derivative formulas to the saved
    gate values (under ``create_graph`` it recomputes them from the inputs, so the gradient stays
    differentiable). ``h'`` and ``c'`` come out through ``_split_views``.
    """
    if not (STATE.enabled and (gates.requires_grad or c.requires_grad)):
        *_, c_new, h_new = _lstm_pieces(gates, c, hidden)
        return h_new, c_new
    with no_grad():
        i, f, g, o, tc, c_new, h_new = _lstm_pieces(gates, c, hidden)
        hc = cat([h_new, c_new], -1)
    need_gates, need_c = gates.requires_grad, c.requires_grad

    def bw(grad: Tensor, gates: Tensor, c: Tensor, i: Tensor, f: Tensor, g: Tensor, o: Tensor, tc: Tensor):
        if STATE.enabled:  # create_graph (grad itself may be a constant): the same formulas on recorded values
            i_, f_, g_, o_, tc_, _, _ = _lstm_pieces(gates, c, hidden)
            c_prev = c
        else:
            i_, f_, g_, o_, tc_, c_prev = i, f, g, o, tc, c.detach()
        gh, gc = grad[..., :hidden], grad[..., hidden:]
        dc = gc + gh * o_ * (1.0 - tc_ * tc_)
        dgates = cat([dc * g_ * i_ * (1.0 - i_), dc * c_prev * f_ * (1.0 - f_), dc * i_ * (1.0 - g_ * g_),
                      gh * tc_ * o_ * (1.0 - o_)], -1) if need_gates else None
        return dgates, (dc * f_ if need_c else None)

    hc = _record(hc, "LSTMCell", (gates, c), (gates, c, i, f, g, o, tc), bw)
    h_new, c_new = _split_views(hc, -1, (hidden, hidden))
    return h_new, c_new


def _lstm_step(xp: Tensor, h: Tensor, c: Tensor, project, b_hh: Tensor | None, w_hr_t: Tensor | None,
               hidden: int) -> tuple[Tensor, Tensor]:
    """PyTorch's LSTM cell, gates in the order i, f, g, o; ``h' = (o * tanh(c')) @ W_hr.T`` with a projection."""
    gates = xp + project(h)
    if b_hh is not None:
        gates = gates + b_hh
    h_new, c_new = _lstm_pointwise(gates, c, hidden)
    if w_hr_t is not None:
        h_new = h_new.matmul(w_hr_t)
    return h_new, c_new


def _gru_pieces(xp: Tensor, hp: Tensor, h: Tensor, hidden: int):
    """The GRU pointwise values (r, z, n, W_hn h + b_hn, h') from the input and hidden projections."""
    H = hidden
    rz = (xp[..., : 2 * H] + hp[..., : 2 * H]).sigmoid()
    r, z = rz[..., :H], rz[..., H:]
    h_n = hp[..., 2 * H:]
    n = (xp[..., 2 * H:] + r * h_n).tanh()
    return r, z, n, h_n, n + z * (h - n)


def _gru_pointwise(xp: Tensor, hp: Tensor, h: Tensor, hidden: int, bx: Tensor | None = None,
                   bp: Tensor | None = None) -> Tensor:
    """``h'`` of a GRU step from the bias-free projections ``xp``, ``hp`` and their biases ``bx``, ``bp``
    (None where absent), as ONE autograd node with a closed-form backward (recomputed from the inputs under
    ``create_graph``, like ``_lstm_pointwise``). The biases are added inside the backend's GRU kernel, as
    PyTorch's fused cell adds them: no separate bias-add pass per step; their gradients are the batch sums of
    the projections' gradients."""
    biases = (bx, bp)
    needs_b = tuple(b is not None and b.requires_grad for b in biases)
    if not (STATE.enabled and (xp.requires_grad or hp.requires_grad or h.requires_grad or any(needs_b))):
        return _gru_pieces(*_with_biases(xp, hp, bx, bp), h, hidden)[-1]
    bk = xp._backend
    X, P, Hd = xp._data, hp._data, h._data
    if not (X.dtype == P.dtype == Hd.dtype and hp._backend is bk and h._backend is bk
            and X.ndim == P.ndim == 2 and X.shape == P.shape and X.dtype.kind == "f"
            and all(b is None or (b._backend is bk and b._data.dtype == X.dtype and b.ndim == 1) for b in biases)):
        return _gru_pointwise_composed(*_with_biases(xp, hp, bx, bp), h, hidden)
    # The per-step values on backend arrays (no Tensor per intermediate: the step loop is host-bound), through
    # the backend's ``gru_cell`` (one kernel on CUDA and OpenCL, as PyTorch's fused GRU cell).
    h_new, rz, n = bk.gru_cell(X, P, Hd, None if bx is None else bx._data, None if bp is None else bp._data)
    # gx / gp are also the biases' gradients before their batch sums
    needs = (xp.requires_grad or needs_b[0], hp.requires_grad or needs_b[1], h.requires_grad)
    which = (xp.requires_grad, hp.requires_grad, h.requires_grad)

    saved = (xp, hp, h, _wrap(rz, bk), _wrap(n, bk), *(b for b in biases if b is not None))
    return _record(_wrap(h_new, bk), "GRUCell", (xp, hp, h, bx, bp), saved,
                   _gru_pointwise_backward(hidden, needs, needs_b, which, bx is not None, bp is not None))


@functools.lru_cache(maxsize=256)
def _gru_pointwise_backward(hidden: int, needs: tuple, needs_b: tuple, which: tuple, has_bx: bool, has_bp: bool):
    """``_gru_pointwise``'s backward, built once per width and set of needed gradients (a closure made per
    step is several objects the cyclic collector tracks: see ``linear._linear_rows_backward``). The biases
    come back among the saved tensors (those that are not None, ``bx`` first)."""

    def bw(grad: Tensor, xp: Tensor, hp: Tensor, h: Tensor, rz_t: Tensor, n_t: Tensor, *bs: Tensor):
        bx = bs[0] if has_bx else None
        bp = bs[-1] if has_bp else None
        if STATE.enabled:  # create_graph (grad itself may be a constant): differentiable in the inputs
            xb, hb = _with_biases(xp, hp, bx, bp)
            gs = _gru_pointwise_grads(grad, *_gru_pieces(xb, hb, h, hidden)[:4], h, needs)
            gb = tuple(gs[k].sum(0) if needs_b[k] else None for k in range(2))
        else:
            bk = grad._backend
            gs = tuple(_wrap(a, bk) for a in bk.gru_cell_backward(grad._data, rz_t._data, n_t._data, h._data,
                                                                  hp._data, None if bp is None else bp._data))
            # The biases' gradients are the batch sums of gx / gp, deferred where the backend accumulates in
            # place (as a linear layer's): a bias shared by every step of the unrolled sequence then costs one
            # column-sum GEMM a step (``bias_grad_accumulate``) and no separate add.
            gb = tuple(_bias_gradient(bk, gs[k]._data) if needs_b[k] else None for k in range(2))
        return (*(gs[k] if which[k] else None for k in range(3)), *gb)

    return bw


def _with_biases(xp: Tensor, hp: Tensor, bx: Tensor | None, bp: Tensor | None) -> tuple[Tensor, Tensor]:
    """The projections with their biases added (tensor ops, recorded where grad mode records)."""
    return (xp if bx is None else xp + bx), (hp if bp is None else hp + bp)


def _gru_pointwise_grads(grad: Tensor, r: Tensor, z: Tensor, n: Tensor, hn: Tensor, h_prev: Tensor,
                         needs: tuple[bool, bool, bool]):
    """The GRU step's closed-form input gradients in tensor ops (differentiable under ``create_graph``)."""
    dn = grad * (1.0 - z) * (1.0 - n * n)
    dr = dn * hn * r * (1.0 - r)
    dz = grad * (h_prev - n) * z * (1.0 - z)
    return (cat([dr, dz, dn], -1) if needs[0] else None,
            cat([dr, dz, dn * r], -1) if needs[1] else None,
            grad * z if needs[2] else None)


def _gru_pointwise_composed(xp: Tensor, hp: Tensor, h: Tensor, hidden: int) -> Tensor:
    """``_gru_pointwise`` in tensor ops (mixed dtypes or devices, unbatched or n-d projections)."""
    with no_grad():
        r, z, n, h_n, h_new = _gru_pieces(xp, hp, h, hidden)
    needs = (xp.requires_grad, hp.requires_grad, h.requires_grad)

    def bw(grad: Tensor, xp: Tensor, hp: Tensor, h: Tensor, r: Tensor, z: Tensor, n: Tensor, h_n: Tensor):
        if STATE.enabled:  # create_graph (grad itself may be a constant): differentiable in the inputs
            return _gru_pointwise_grads(grad, *_gru_pieces(xp, hp, h, hidden)[:4], h, needs)
        return _gru_pointwise_grads(grad, r, z, n, h_n, h.detach(), needs)

    return _record(h_new, "GRUCell", (xp, hp, h), (xp, hp, h, r, z, n, h_n), bw)


def _gru_step(xp: Tensor, h: Tensor, project, b_ih: Tensor | None, b_hh: Tensor | None, hidden: int) -> Tensor:
    """PyTorch's GRU cell, gates r, z, n: ``n = tanh(x_n + b_in + r * (W_hn h + b_hn))``,
    ``h' = (1 - z) n + z h``; ``xp`` is ``x @ W_ih.T`` (with ``b_ih`` already added when ``b_ih`` is None),
    ``project(h)`` is ``h @ W_hh.T``; the biases are added inside the step's kernel."""
    return _gru_pointwise(xp, project(h), h, hidden, b_ih, b_hh)


# ---------------------------------------------------------------------- multi-layer recurrent layers
class RNNBase(Module):
    """Shared machinery of ``RNN``, ``LSTM`` and ``GRU`` (``mode`` is ``'RNN_TANH'``, ``'RNN_RELU'``,
    ``'LSTM'`` or ``'GRU'``, as in PyTorch)."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None) -> None:
        super().__init__()
        if mode not in _GATES:
            raise FlowError(f"RNNBase: mode must be one of {sorted(_GATES)}, got {mode!r}")
        name = type(self).__name__
        if not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise FlowError(f"{name}: dropout must be a number in [0, 1], got {dropout!r}")
        if hidden_size <= 0 or num_layers <= 0:
            raise FlowError(f"{name}: hidden_size and num_layers must be positive, got {hidden_size} and "
                            f"{num_layers}")
        if proj_size < 0:
            raise FlowError(f"{name}: proj_size must be >= 0 (0 disables the projection), got {proj_size}")
        if proj_size >= hidden_size:
            raise FlowError(f"{name}: proj_size ({proj_size}) must be smaller than hidden_size ({hidden_size})")
        if proj_size and mode != "LSTM":
            raise FlowError(f"{name}: proj_size is supported by LSTM only")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{name}: dropout={dropout} has no effect with num_layers=1 (dropout is applied "
                          "between layers)", stacklevel=2)
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        directions = 2 if bidirectional else 1
        real_hidden = proj_size if proj_size > 0 else hidden_size
        gate_size = _GATES[mode] * hidden_size
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else real_hidden * directions
            for direction in range(directions):
                suffix = "_reverse" if direction == 1 else ""
                shapes = [(f"weight_ih_l{layer}{suffix}", (gate_size, layer_input)),
                          (f"weight_hh_l{layer}{suffix}", (gate_size, real_hidden))]
                if bias:
                    shapes += [(f"bias_ih_l{layer}{suffix}", (gate_size,)),
                               (f"bias_hh_l{layer}{suffix}", (gate_size,))]
                if proj_size > 0:
                    shapes.append((f"weight_hr_l{layer}{suffix}", (proj_size, hidden_size)))
                for pname, pshape in shapes:
                    setattr(self, pname, Parameter(empty(*pshape, device=device, dtype=dtype)))
                    self._flat_weights_names.append(pname)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's initialisation: every weight and bias ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""
        stdv = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """No-op kept for PyTorch compatibility (cuDNN's packed weight buffer has no counterpart here)."""

    @property
    def all_weights(self) -> list[list[Parameter]]:
        """Parameters grouped per layer and direction, in PyTorch's order."""
        per = len(self._flat_weights_names) // (self.num_layers * (2 if self.bidirectional else 1))
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[i:i + per]] for i in range(0, len(names), per)]

    def _weights(self, layer: int, direction: int):
        suffix = "_reverse" if direction == 1 else ""
        get = self._parameters.get
        return (get(f"weight_ih_l{layer}{suffix}"), get(f"weight_hh_l{layer}{suffix}"),
                get(f"bias_ih_l{layer}{suffix}"), get(f"bias_hh_l{layer}{suffix}"),
                get(f"weight_hr_l{layer}{suffix}"))

    def _check_input(self, input: Tensor) -> bool:
        name = type(self).__name__
        if input.ndim not in (2, 3):
            raise ShapeError(f"{name}: expected a 2-d (unbatched) or 3-d input, got shape {tuple(input.shape)}")
        if input.shape[-1] != self.input_size:
            raise ShapeError(f"{name}: input has {input.shape[-1]} features (last dim of {tuple(input.shape)}), "
                             f"expected input_size={self.input_size}")
        return input.ndim == 3

    def _state(self, given: Tensor | None, batch: int, size: int, like: Tensor, batched: bool, what: str
               ) -> Tensor:
        layers = self.num_layers * (2 if self.bidirectional else 1)
        if given is None:
            return zeros(layers, batch, size, dtype=like.dtype, device=like.device)
        expected = (layers, batch, size) if batched else (layers, size)
        if tuple(given.shape) != expected:
            raise ShapeError(f"{type(self).__name__}: {what} has shape {tuple(given.shape)}, expected {expected} "
                             f"(num_layers * num_directions, {'batch, ' if batched else ''}hidden)")
        return given if batched else given.unsqueeze(1)

    def _run_direction(self, x: Tensor, h: Tensor, c: Tensor | None, layer: int, direction: int):
        """One layer in one direction over the whole sequence ``x`` (L, N, F)."""
        w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, direction)
        mode, hidden = self.mode, self.hidden_size
        L, N, F = x.shape
        # the input projection of every time step at once, as one 2-d matmul
        xp = x.reshape(L * N, F).matmul(w_ih.t()).reshape(L, N, w_ih.shape[0])
        if b_ih is not None:
            # b_hh adds linearly except inside GRU's n gate, so RNN/LSTM fold it into the hoisted projection
            xp = xp + (b_ih if mode == "GRU" else b_ih + b_hh)
        step_bias = b_hh if mode == "GRU" else None
        project = _HiddenProjection(w_hh)
        w_hr_t = None if w_hr is None else w_hr.t()
        steps = _split_views(xp, 0, [1] * x.shape[0], squeeze=True)
        order = range(len(steps) - 1, -1, -1) if direction == 1 else range(len(steps))
        outs: list = [None] * len(steps)
        for t in order:
            if mode == "LSTM":
                h, c = _lstm_step(steps[t], h, c, project, step_bias, w_hr_t, hidden)
            elif mode == "GRU":
                h = _gru_step(steps[t], h, project, None, step_bias, hidden)
            else:
                h = _rnn_step(steps[t], h, project, step_bias, mode == "RNN_RELU")
            outs[t] = h
        return stack(outs, 0), h, c

    def forward(self, input: Tensor, hx=None):
        """Run the layer: ``output, h_n`` (``output, (h_n, c_n)`` for LSTM)."""
        batched = self._check_input(input)
        x = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        batch = x.shape[1]
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        is_lstm = self.mode == "LSTM"
        if is_lstm:
            if hx is not None and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise FlowError("LSTM: hx must be a tuple (h_0, c_0) or None")
            h0 = self._state(None if hx is None else hx[0], batch, real_hidden, x, batched, "h_0")
            c0 = self._state(None if hx is None else hx[1], batch, self.hidden_size, x, batched, "c_0")
        else:
            if hx is not None and not isinstance(hx, Tensor):
                raise FlowError(f"{type(self).__name__}: hx must be a Tensor or None, got {type(hx).__name__}")
            h0 = self._state(hx, batch, real_hidden, x, batched, "hx")
            c0 = None
        directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(directions):
                k = layer * directions + direction
                out, h, c = self._run_direction(x, h0[k], None if c0 is None else c0[k], layer, direction)
                outs.append(out)
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if directions == 1 else cat(outs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = _dropout(x, self.dropout, True)
        output = x
        h_out = stack(h_n, 0)
        c_out = stack(c_n, 0) if is_lstm else None
        if not batched:
            output = output.squeeze(1)
            h_out = h_out.squeeze(1)
            c_out = c_out.squeeze(1) if is_lstm else None
        elif self.batch_first:
            output = output.transpose(0, 1)
        return (output, (h_out, c_out)) if is_lstm else (output, h_out)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(RNNBase):
    """Elman RNN: ``h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` with ``act`` tanh or relu.

    ``RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True, batch_first=False,
    dropout=0.0, bidirectional=False)``; returns ``(output, h_n)``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise FlowError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size,
                         num_layers, bias, batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s + (", nonlinearity='relu'" if self.nonlinearity == "relu" else "")


class LSTM(RNNBase):
    """Long short-term memory (PyTorch's gates i, f, g, o), optional output projection ``proj_size``.

    Returns ``(output, (h_n, c_n))``; ``hx`` is ``(h_0, c_0)`` or None for zeros.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size, device, dtype)


class GRU(RNNBase):
    """Gated recurrent unit (PyTorch's gates r, z, n with ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``).

    Returns ``(output, h_n)``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype)


# ---------------------------------------------------------------------- cells
class RNNCellBase(Module):
    """Shared parameters of the cells: ``weight_ih`` (G*H, in), ``weight_hh`` (G*H, H), ``bias_ih``, ``bias_hh``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device=None, dtype=None
                 ) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(empty(num_chunks * hidden_size, input_size, device=device, dtype=dtype))
        self.weight_hh = Parameter(empty(num_chunks * hidden_size, hidden_size, device=device, dtype=dtype))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every weight and bias ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as in PyTorch."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for p in self.parameters():
            init.uniform_(p, -stdv, stdv)

    def _prepare(self, input: Tensor, hx: Tensor | None, what: str = "hx") -> tuple[Tensor, Tensor | None, bool]:
        name = type(self).__name__
        if input.ndim not in (1, 2):
            raise ShapeError(f"{name}: expected a 1-d (unbatched) or 2-d (N, input_size) input, "
                             f"got shape {tuple(input.shape)}")
        if input.shape[-1] != self.input_size:
            raise ShapeError(f"{name}: input has {input.shape[-1]} features, expected input_size={self.input_size}")
        batched = input.ndim == 2
        if hx is not None and hx.ndim != input.ndim:
            raise ShapeError(f"{name}: {what} must be {input.ndim}-d like the input, got shape {tuple(hx.shape)}")
        x = input if batched else input.unsqueeze(0)
        h = None if hx is None else (hx if batched else hx.unsqueeze(0))
        return x, h, batched

    def _projection(self, x: Tensor) -> Tensor:
        return linear(x, self.weight_ih, self.bias_ih)  # one node (matmul, transpose and bias fused)

    def _hidden(self, h: Tensor) -> Tensor:
        """``h @ W_hh.T + b_hh`` as one node (the step functions then get ``b_hh=None``)."""
        return linear(h, self.weight_hh, self.bias_hh)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        return s if self.bias else s + ", bias=False"


class RNNCell(RNNCellBase):
    """One Elman RNN step: ``h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)``; ``hx`` defaults to zeros."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise FlowError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, h, batched = self._prepare(input, hx)
        if h is None:
            h = zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
        out = _rnn_step(self._projection(x), h, self._hidden, None, self.nonlinearity == "relu")
        return out if batched else out.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step: returns ``(h', c')``; ``hx`` is ``(h, c)`` or None for zeros."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        x, h, batched = self._prepare(input, None if hx is None else hx[0])
        if hx is None:
            h = zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            c = h
        else:
            c = hx[1] if batched else hx[1].unsqueeze(0)
        h_new, c_new = _lstm_step(self._projection(x), h, c, self._hidden, None, None,
                                  self.hidden_size)
        return (h_new, c_new) if batched else (h_new.squeeze(0), c_new.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step (PyTorch's r, z, n gates); ``hx`` defaults to zeros."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, h, batched = self._prepare(input, hx)
        if h is None:
            h = zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
        # bias-free projections: the biases are added inside the step's kernel (PyTorch's fused GRU cell)
        xp = linear(x, self.weight_ih)
        out = _gru_step(xp, h, lambda s: linear(s, self.weight_hh), self.bias_ih, self.bias_hh, self.hidden_size)
        return out if batched else out.squeeze(0)
