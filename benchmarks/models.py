"""The seven models of floDl's benchmark suite and three real CNNs from pytorch/examples (mnist's ``Net``, DCGAN's
generator and discriminator), built twice: with flowgraph's FlowBuilder and in PyTorch.

Both sides register parameters in the same order, so ``copy_torch_weights`` can pair them one to one
(checking names' last part and shapes) and the same-initial-weights check can compare losses.

``scale`` shrinks widths and batch for the CPU configuration (1.0 is floDl's GPU size); the sequence
length, depth and iteration counts never change, so the graph shape of each model is the same at any scale.
"""

from __future__ import annotations

from dataclasses import dataclass

MODELS = ("mlp", "convnet", "gru_seq", "residual_tower", "gated_routing", "iterative_refine", "feedback_fixed",
          "mnist_net", "dcgan_g", "dcgan_d")

DCGAN_NZ = 100  # DCGAN's latent size (pytorch/examples' --nz), never scaled


@dataclass(frozen=True)
class Spec:
    """Sizes of one model at one scale."""

    name: str
    batch: int
    width: int
    hidden: int
    out: int
    input_shape: tuple[int, ...]
    target_shape: tuple[int, ...]


def spec(name: str, scale: float = 1.0) -> Spec:
    """Sizes for ``name`` at ``scale`` (widths and batch scaled, at least 8)."""

    def s(n: int) -> int:
        return max(8, int(round(n * scale)))

    if name == "mlp":
        b = s(256)
        return Spec(name, b, s(1024), s(2048), s(1024), (b, s(1024)), (b, s(1024)))
    if name == "convnet":
        b = s(128)
        side = 64 if scale >= 1 else 32
        return Spec(name, b, 3, s(64), 100, (b, 3, side, side), (b, 100))
    if name == "gru_seq":
        b = s(128)
        return Spec(name, b, s(256), s(512), s(256), (b, 50, s(256)), (b, s(256)))
    if name == "residual_tower":
        b = s(256)
        return Spec(name, b, s(1024), s(1024), s(1024), (b, s(1024)), (b, s(1024)))
    if name == "gated_routing":
        b = s(256)
        return Spec(name, b, s(512), s(512), s(512), (b, s(512)), (b, s(512)))
    if name == "iterative_refine":
        b = s(256)
        return Spec(name, b, s(1024), s(1024), s(1024), (b, s(1024)), (b, s(1024)))
    if name == "feedback_fixed":
        b = s(128)
        return Spec(name, b, s(512), s(512), s(512), (b, s(512)), (b, s(512)))
    if name == "mnist_net":  # pytorch/examples mnist: fixed widths (fc1 reads 64*12*12), batch 64 at CPU scale
        b = s(256)
        return Spec(name, b, 1, 128, 10, (b, 1, 28, 28), (b, 10))
    if name == "dcgan_g":  # pytorch/examples dcgan: ngf=64 scaled, 64x64 RGB images, batch 32 at CPU scale
        b = s(128)
        return Spec(name, b, DCGAN_NZ, s(64), 3, (b, DCGAN_NZ, 1, 1), (b, 3, 64, 64))
    if name == "dcgan_d":  # ndf=64 scaled
        b = s(128)
        return Spec(name, b, 3, s(64), 1, (b, 3, 64, 64), (b, 1, 1, 1))
    raise ValueError(f"unknown benchmark model {name!r}; choose from {MODELS}")


def _conv_channels(sp: Spec) -> list[int]:
    base = sp.hidden  # 64 at full scale
    return [3, base, base * 2, base * 4, base * 8, base * 8]


def flowgraph_training(name: str, scale: float, device: str):
    """``(model, Adam optimizer, x, y, MSE loss)`` for one fixed batch of ``name`` on ``device``: the setup of
    the step probes (``profile_step``, ``gc_collections``), seeded as the benchmark seeds its models."""
    import numpy as np

    import flowgraph as fg
    from flowgraph import nn, optim

    fg.manual_seed(0)
    model = build_flowgraph(name, scale).to(device)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    sp = spec(name, scale)
    rng = np.random.default_rng(0)
    x = fg.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32), device=device)
    y = fg.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32), device=device)
    return model, opt, x, y, nn.MSELoss()


# ---------------------------------------------------------------------- flowgraph
def build_flowgraph(name: str, scale: float = 1.0):
    """The flowgraph Graph for ``name``."""
    from flowgraph import nn
    from flowgraph.builder import FlowBuilder

    sp = spec(name, scale)

    def block(d: int):
        return nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))

    if name == "mlp":
        fb = FlowBuilder.from_(nn.Linear(sp.width, sp.hidden)).through(nn.GELU()).through(nn.LayerNorm(sp.hidden))
        for _ in range(3):
            fb = fb.through(nn.Linear(sp.hidden, sp.hidden)).through(nn.GELU()).through(nn.LayerNorm(sp.hidden))
        return fb.through(nn.Linear(sp.hidden, sp.out)).build()
    if name == "convnet":
        ch = _conv_channels(sp)
        fb = FlowBuilder()
        for i in range(5):
            fb = (fb.through(nn.Conv2d(ch[i], ch[i + 1], 3, padding=1)).through(nn.BatchNorm2d(ch[i + 1]))
                  .through(nn.ReLU()))
            if i < 4:
                fb = fb.through(nn.MaxPool2d(2))
        return (fb.through(nn.AdaptiveAvgPool2d(1)).through(nn.Flatten())
                .through(nn.Linear(ch[5], sp.out)).build())
    if name == "gru_seq":
        return FlowBuilder.from_(GRUUnroll(nn.GRUCell(sp.width, sp.hidden))).through(
            nn.Linear(sp.hidden, sp.out)).build()
    if name == "residual_tower":
        fb = FlowBuilder.from_(nn.Linear(sp.width, sp.hidden))
        for _ in range(12):
            fb = fb.also(block(sp.hidden))
        return fb.through(nn.Linear(sp.hidden, sp.out)).build()
    if name == "gated_routing":
        experts = [block(sp.hidden) for _ in range(8)]
        return (FlowBuilder.from_(nn.Linear(sp.width, sp.hidden)).through(nn.GELU())
                .gate(nn.Sequential(nn.Linear(sp.hidden, 8), nn.Softmax(-1)), experts)
                .through(nn.Linear(sp.hidden, sp.out)).build())
    if name in ("iterative_refine", "feedback_fixed"):
        iters = 8 if name == "iterative_refine" else 10
        body = FlowBuilder().also(block(sp.hidden)).build()
        return (FlowBuilder.from_(nn.Linear(sp.width, sp.hidden)).through(nn.GELU()).through(nn.LayerNorm(sp.hidden))
                .loop_body(body).for_n(iters).through(nn.Linear(sp.hidden, sp.out)).build())
    if name in ("mnist_net", "dcgan_g", "dcgan_d"):
        fb = FlowBuilder()
        for layer in _cnn_layers(nn, name, sp):
            fb = fb.through(layer)
        return fb.build()
    raise ValueError(name)


def _cnn_layers(nn, name: str, sp: Spec) -> list:
    """The layers of pytorch/examples' mnist ``Net`` or DCGAN ``Generator`` / ``Discriminator``, from ``nn``
    (flowgraph's or torch's: both spell them the same). mnist's ``log_softmax`` output is kept; the benchmark's
    MSE against a random target replaces ``nll_loss``."""
    if name == "mnist_net":
        return [nn.Conv2d(1, 32, 3, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Dropout(0.25), nn.Flatten(), nn.Linear(9216, sp.hidden), nn.ReLU(), nn.Dropout(0.5),
                nn.Linear(sp.hidden, sp.out), nn.LogSoftmax(1)]
    f = sp.hidden
    if name == "dcgan_g":
        return [nn.ConvTranspose2d(sp.width, f * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(f * 8), nn.ReLU(True),
                nn.ConvTranspose2d(f * 8, f * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(f * 4), nn.ReLU(True),
                nn.ConvTranspose2d(f * 4, f * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(f * 2), nn.ReLU(True),
                nn.ConvTranspose2d(f * 2, f, 4, 2, 1, bias=False), nn.BatchNorm2d(f), nn.ReLU(True),
                nn.ConvTranspose2d(f, sp.out, 4, 2, 1, bias=False), nn.Tanh()]
    if name == "dcgan_d":
        return [nn.Conv2d(sp.width, f, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(f, f * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(f * 2), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(f * 2, f * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(f * 4), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(f * 4, f * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(f * 8), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(f * 8, sp.out, 4, 1, 0, bias=False), nn.Sigmoid()]
    raise ValueError(name)


def _gru_unroll_class():
    from flowgraph import nn, zeros

    class _GRUUnroll(nn.Module):
        """Runs a GRUCell over the time axis of a (batch, time, features) input from a zero state."""

        def __init__(self, cell):
            super().__init__()
            self.cell = cell

        def forward(self, x):
            h = zeros(x.shape[0], self.cell.hidden_size, device=x.device, dtype=x.dtype)
            for xt in x.unbind(1):
                h = self.cell(xt, h)
            return h

    return _GRUUnroll


def GRUUnroll(cell):  # noqa: N802 - reads as a class at the call site
    """A module running ``cell`` over time from zeros and returning the last state."""
    return _gru_unroll_class()(cell)


# ---------------------------------------------------------------------- PyTorch
def build_torch(name: str, scale: float = 1.0):
    """The same model in PyTorch, parameters registered in the same order."""
    import torch
    from torch import nn

    sp = spec(name, scale)

    def block(d: int):
        return nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))

    class Residual(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return x + self.inner(x)

    if name == "mlp":
        layers = [nn.Linear(sp.width, sp.hidden), nn.GELU(), nn.LayerNorm(sp.hidden)]
        for _ in range(3):
            layers += [nn.Linear(sp.hidden, sp.hidden), nn.GELU(), nn.LayerNorm(sp.hidden)]
        return nn.Sequential(*layers, nn.Linear(sp.hidden, sp.out))
    if name == "convnet":
        ch = _conv_channels(sp)
        layers = []
        for i in range(5):
            layers += [nn.Conv2d(ch[i], ch[i + 1], 3, padding=1), nn.BatchNorm2d(ch[i + 1]), nn.ReLU()]
            if i < 4:
                layers.append(nn.MaxPool2d(2))
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ch[5], sp.out))
    if name == "gru_seq":
        class Unroll(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = nn.GRUCell(sp.width, sp.hidden)

            def forward(self, x):
                h = torch.zeros(x.shape[0], sp.hidden, device=x.device, dtype=x.dtype)
                for xt in x.unbind(1):
                    h = self.cell(xt, h)
                return h

        return nn.Sequential(Unroll(), nn.Linear(sp.hidden, sp.out))
    if name == "residual_tower":
        return nn.Sequential(nn.Linear(sp.width, sp.hidden), *[Residual(block(sp.hidden)) for _ in range(12)],
                             nn.Linear(sp.hidden, sp.out))
    if name == "gated_routing":
        class Gate(nn.Module):
            def __init__(self):
                super().__init__()
                self.router = nn.Sequential(nn.Linear(sp.hidden, 8), nn.Softmax(-1))
                self.experts = nn.ModuleList([block(sp.hidden) for _ in range(8)])

            def forward(self, x):
                w = self.router(x)
                outs = torch.stack([e(x) for e in self.experts], dim=-1)
                return (outs * w.unsqueeze(-2)).sum(-1)

        return nn.Sequential(nn.Linear(sp.width, sp.hidden), nn.GELU(), Gate(), nn.Linear(sp.hidden, sp.out))
    if name in ("iterative_refine", "feedback_fixed"):
        iters = 8 if name == "iterative_refine" else 10

        class Loop(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = Residual(block(sp.hidden))

            def forward(self, x):
                for _ in range(iters):
                    x = self.body(x)
                return x

        return nn.Sequential(nn.Linear(sp.width, sp.hidden), nn.GELU(), nn.LayerNorm(sp.hidden), Loop(),
                             nn.Linear(sp.hidden, sp.out))
    if name in ("mnist_net", "dcgan_g", "dcgan_d"):
        return nn.Sequential(*_cnn_layers(nn, name, sp))
    raise ValueError(name)


def copy_torch_weights(fg_model, torch_model) -> None:
    """Load the torch model's parameters and buffers into the flowgraph model, pairing them in order.

    Pairs must agree on the key's last part (``weight``, ``bias``, ``running_mean`` ...) and shape; anything
    else raises, so a silent mispairing cannot happen.
    """
    from flowgraph.tree import key_map_by_order

    state = {k: v.detach().cpu().numpy() for k, v in torch_model.state_dict().items()}
    mapping = key_map_by_order(fg_model, list(state), {k: v.shape for k, v in state.items()})
    import flowgraph as fg

    fg_model.load_state_dict({mapping[k]: fg.tensor(v) for k, v in state.items()})
