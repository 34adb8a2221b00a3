"""A graph that uses every FlowBuilder verb, trained on a synthetic regression task.

    python examples/showcase/train.py --epochs 10 --device cpu
    python examples/showcase/train.py --epochs 50 --serve        # live dashboard on http://127.0.0.1:3000

The model reads ``x`` (8 features) and a context ``ctx`` (4 features, an extra graph input) and predicts
``y = tanh(x @ A) * (1 + ctx[:, :1])`` (2 outputs). Its diagram (SVG, or DOT without Graphviz), the HTML report
and the CSV go to the run folder ``runs/showcase/`` (``--out``), never into the source tree; the dashboard draws
the graph in the browser when Graphviz is not installed.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

import flowgraph as fg
from flowgraph import nn
from flowgraph.builder import FlowBuilder, Graph, MergeOp

RUN_DIR = Path("runs") / "showcase"
D = 16
BATCH = 32


class ContextMix(nn.Module):
    """``x + Linear(ctx)``: takes the graph input ``ctx`` as a keyword ref."""

    def __init__(self, c: int, d: int):
        super().__init__()
        self.proj = nn.Linear(c, d)

    def forward(self, x, ctx):
        return x + self.proj(ctx)


class Refine(nn.Module):
    """One refinement step, ``x + 0.5 * tanh(Linear(x))`` (shape-preserving, as halting loops need)."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return x + 0.5 * self.lin(x).tanh()


def build_model(d: int = D) -> Graph:
    """The showcase graph: every verb once, a labelled encoder subgraph inside."""
    encoder = (FlowBuilder.from_(nn.Linear(8, d))
               .through(nn.GELU())
               .also(nn.Sequential(nn.Linear(d, d), nn.Tanh())).tag("hidden")        # residual
               .label("encoder")
               .build())
    return (FlowBuilder.from_(encoder).tag("encoded")
            .input("ctx")                                                            # graph(x, ctx)
            .through(ContextMix(4, d)).using("ctx")                                  # backward ref
            .fork(nn.Linear(d, 1)).tag("aux")                                        # side head
            .split(nn.Linear(d, d), nn.Linear(d, d)).merge(MergeOp.MEAN)             # parallel branches
            .through(nn.StateAdd()).using("memory")                                  # forward ref: last call
            .through(nn.LayerNorm(d)).tag("memory")
            .loop_body(Refine(d)).until_cond(nn.LearnedHalt(d), 3)                   # per-row halting
            .gate(nn.SoftmaxRouter(d, 2), [nn.Linear(d, d), nn.Linear(d, d)]).using("encoded")  # soft MoE
            .switch(nn.ArgmaxSelector(d, 2), [nn.Linear(d, d), nn.Linear(d, d)])     # hard, per-row routing
            .map(nn.Linear(d // 4, 2)).slices(4)                                     # (B, 16) -> (B, 8)
            .through(nn.Linear(8, 2))
            .label("showcase")
            .build(sample=(fg.zeros(BATCH, 8), fg.zeros(BATCH, 4))))


def make_data(n: int = 512, seed: int = 0) -> tuple[fg.Tensor, fg.Tensor, fg.Tensor]:
    """``(x, ctx, y)`` for the synthetic task."""
    fg.manual_seed(seed)
    x = fg.randn(n, 8)
    ctx = fg.randn(n, 4)
    a = fg.randn(8, 2) / math.sqrt(8)
    y = (x @ a).tanh() * (1 + 0.5 * ctx[:, :1])
    return x, ctx, y


def _optimizer(params: list) -> object:
    try:
        from flowgraph.optim import Adam
    except ImportError:  # the optimiser library is optional for this example
        from flowgraph.optim import SGD

        return SGD(params, lr=0.05)
    return Adam(params, lr=3e-3)


def train(epochs: int = 10, device: str = "cpu", on_epoch: Callable[[int, float, dict], None] | None = None,
          model: Graph | None = None, seed: int = 0) -> tuple[Graph, list[dict]]:
    """Train for ``epochs``; ``on_epoch(epoch, seconds, metrics)`` after each. Returns the model and history."""
    fg.manual_seed(seed)
    model = (model or build_model()).to(device)
    x, ctx, y = (t.to(device) for t in make_data(seed=seed))
    opt = _optimizer(list(model.parameters()))
    history = []
    n = x.shape[0] // BATCH * BATCH
    for epoch in range(epochs):
        start = time.perf_counter()
        model.train()
        model.reset_state()
        order = fg.randperm(x.shape[0], device=device)
        total = aux_total = 0.0
        for i in range(0, n, BATCH):
            idx = order[i:i + BATCH]
            xb, cb, yb = x.index_select(0, idx), ctx.index_select(0, idx), y.index_select(0, idx)
            pred = model(xb, ctx=cb)
            aux = model.tag_values["aux"]
            loss = ((pred - yb) ** 2).mean()
            aux_loss = ((aux - yb[:, :1]) ** 2).mean()
            opt.zero_grad()
            (loss + 0.1 * aux_loss).backward()
            opt.step()
            model.detach_state()           # keep 'memory' across batches, but not its gradient history
            total += float(loss.item())
            aux_total += float(aux_loss.item())
        batches = n // BATCH
        metrics = {"loss": total / batches, "aux_loss": aux_total / batches,
                   "loop_passes": model.loop_info()["loop_0"].iterations}
        seconds = time.perf_counter() - start
        history.append({"epoch": epoch, "seconds": seconds, **metrics})
        if on_epoch is not None:
            on_epoch(epoch, seconds, metrics)
    return model, history


def write_svg(model: Graph, path: Path = RUN_DIR / "showcase.svg") -> Path:
    """Write the model's SVG (or, without Graphviz's ``dot``, its DOT source next to it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        model.svg(str(path))
        return path
    except fg.FlowError as exc:
        dot_path = path.with_suffix(".dot")
        dot_path.write_text(model.dot())
        print(f"{exc}\nwrote the DOT source to {dot_path} instead (the dashboard draws it in the browser)")
        return dot_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--serve", action="store_true", help="live dashboard on http://127.0.0.1:3000")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--linger", type=float, default=30.0,
                        help="with --serve: seconds the final dashboard stays up after training (Ctrl-C ends it)")
    parser.add_argument("--out", default=str(RUN_DIR),
                        help="the run folder: diagram, report, CSV (default: %(default)s)")
    parser.add_argument("--report", default=None, help="where the HTML report is written (default: OUT/report.html)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report_path = Path(args.report) if args.report else out / "report.html"

    from flowgraph.monitor import Monitor

    model = build_model()
    print(f"written {write_svg(model, out / 'showcase.svg')}")
    with Monitor(total_epochs=args.epochs, report_path=report_path, title="showcase") as monitor:
        monitor.watch(model)
        if args.serve:
            print(f"dashboard: {monitor.serve(port=args.port)}", flush=True)

        def report(epoch: int, seconds: float, metrics: dict) -> None:
            for name, value in metrics.items():     # batch-level values were averaged by train()
                model.record(name, value)
            model.flush()
            monitor.log(epoch, seconds, model)      # reads model.latest_metrics(), parameters, structure

        train(args.epochs, args.device, on_epoch=report, model=model)
        monitor.finish(keep_serving=args.serve)
        monitor.export_csv(str(report_path.with_suffix(".csv")))
        if args.serve and args.linger > 0:
            print(f"training done; the dashboard stays up for {args.linger:.0f}s (Ctrl-C to quit)", flush=True)
            try:
                time.sleep(args.linger)
            except KeyboardInterrupt:
                pass
        monitor.close()


if __name__ == "__main__":
    main()
