"""Benchmark flowgraph against PyTorch on floDl's seven models (and three CNNs of pytorch/examples), side by side.

    python -m benchmarks --device cpu --models all --rounds 3 --json out.json
    python -m benchmarks --device cuda --scale 1.0 --capture      # on an NVIDIA GPU
    python -m benchmarks --device cuda --capture --compile         # and torch.compile's step

Protocol (the benchmark issue's): float32, 50 pre-generated random batches per epoch already on the
device, MSE loss, Adam lr 1e-3; each step is forward, loss, zero_grad, backward, step, loss.item();
warm-up epochs, then timed epochs with a device sync; the median epoch per round; several rounds
alternating which framework goes first; the table reports the median over rounds and the spread
(min-max of the round medians), in ms per epoch, and the ratio flowgraph / PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from .models import MODELS, build_flowgraph, build_torch, copy_torch_weights, spec


# ---------------------------------------------------------------------- one framework, one model
class FlowgraphRunner:
    """Trains a flowgraph model with the benchmark protocol."""

    name = "flowgraph"

    def __init__(self, model_name: str, scale: float, device: str, steps: int, capture: bool = False):
        import numpy as np

        import flowgraph as fg
        from flowgraph import nn, optim

        self.fg = fg
        fg.manual_seed(0)
        self.model = build_flowgraph(model_name, scale).to(device)
        self.opt = optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.MSELoss()
        sp = spec(model_name, scale)
        rng = np.random.default_rng(1)
        self.batches = [
            (fg.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32), device=device),
             fg.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32), device=device))
            for _ in range(steps)
        ]
        self.backend = fg.get_backend(device)
        self.step_fn = self._step
        if capture:  # fg.jit: CUDA graphs on cuda, recorded backend calls on cpu and opencl
            self.step_fn = fg.jit(self._step)

    def _step(self, x, y) -> float:
        loss = self.loss_fn(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss

    def epoch(self) -> float:
        start = time.perf_counter()
        for x, y in self.batches:
            loss = self.step_fn(x, y)
            loss.item()
        self.backend.synchronize()
        return time.perf_counter() - start

    def memory_in_use(self) -> int | None:
        """Bytes allocated on the device now (None where the backend does not count them)."""
        return self.backend.memory_stats().get("allocated")

    def reset_peak(self) -> None:
        """Start the peak from the bytes allocated now."""
        reset = getattr(self.backend, "reset_peak_memory_stats", None)
        if reset is not None:
            reset()

    def peak_memory(self) -> int | None:
        """Peak bytes allocated since the last :meth:`reset_peak`."""
        return self.backend.memory_stats().get("peak")


class TorchRunner:
    """Trains the PyTorch model with the same protocol (fused Adam on CUDA; optional CUDA-graph capture, or
    ``compile``: the model through ``torch.compile`` in ``compile_mode`` ("default", or "reduce-overhead" for
    CUDA graphs too), forward and backward compiled by Inductor, the optimizer eager, as PyTorch's tutorials
    train)."""

    name = "torch"

    def __init__(self, model_name: str, scale: float, device: str, steps: int, capture: bool = False,
                 compile: bool = False, compile_mode: str = "default"):  # noqa: A002 - torch.compile's name
        import numpy as np
        import torch

        self.torch = torch
        torch.manual_seed(0)
        # An OpenCL run compares with torch on the same machine's GPU when there is one (CPU otherwise).
        accel = device.startswith("cuda") or (device.startswith("opencl") and torch.cuda.is_available())
        self.device = "cuda" if accel else "cpu"
        self.model = build_torch(model_name, scale).to(self.device)
        fused = self.device == "cuda"
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, fused=fused or None,
                                    capturable=capture or False)
        self.loss_fn = torch.nn.MSELoss()
        sp = spec(model_name, scale)
        rng = np.random.default_rng(1)
        self.batches = [
            (torch.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32), device=self.device),
             torch.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32), device=self.device))
            for _ in range(steps)
        ]
        self.graph = None
        self.forward = torch.compile(self.model, mode=compile_mode) if compile else self.model
        # CUDA graphs under torch.compile ("reduce-overhead") reuse their output buffers: PyTorch's training
        # loops mark where each step begins, so the previous step's outputs are not read after being overwritten
        self.mark_step = compile and self.device == "cuda"
        if capture:
            self._capture()

    def _step(self, x, y):
        if self.mark_step:
            self.torch.compiler.cudagraph_mark_step_begin()
        loss = self.loss_fn(self.forward(x), y)
        # a captured step keeps its gradient buffers; a compiled one drops them (CUDA graphs under torch.compile
        # own the backward's outputs: gradients kept across steps would be overwritten by the next replay)
        self.opt.zero_grad(set_to_none=self.mark_step)
        loss.backward()
        self.opt.step()
        return loss

    def _capture(self) -> None:
        torch = self.torch
        self.static_x = self.batches[0][0].clone()
        self.static_y = self.batches[0][1].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._step(self.static_x, self.static_y)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_loss = self._step(self.static_x, self.static_y)

    def epoch(self) -> float:
        torch = self.torch
        start = time.perf_counter()
        for x, y in self.batches:
            if self.graph is not None:
                self.static_x.copy_(x)
                self.static_y.copy_(y)
                self.graph.replay()
                loss = self.static_loss
            else:
                loss = self._step(x, y)
            loss.item()
        if self.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def memory_in_use(self) -> int | None:
        """Bytes allocated on the GPU now (None on the CPU)."""
        return int(self.torch.cuda.memory_allocated()) if self.device == "cuda" else None

    def reset_peak(self) -> None:
        """Start the peak from the bytes allocated now."""
        if self.device == "cuda":
            self.torch.cuda.reset_peak_memory_stats()

    def peak_memory(self) -> int | None:
        """Peak bytes allocated since the last :meth:`reset_peak` (None on the CPU)."""
        if self.device == "cuda":
            return int(self.torch.cuda.max_memory_allocated())
        return None


# ---------------------------------------------------------------------- protocol
def time_model(model_name: str, args) -> dict:
    """Median ms/epoch per framework over rounds, with spread, for one model."""
    runners = {}
    variants = [("flowgraph", FlowgraphRunner, {}), ("torch", TorchRunner, {})]
    if args.capture:
        variants += [("flowgraph_jit", FlowgraphRunner, {"capture": True})]
        if args.device.startswith("cuda"):
            variants += [("torch_graph", TorchRunner, {"capture": True})]
    if args.compile:
        variants += [("torch_compile", TorchRunner, {"compile": True, "compile_mode": args.compile_mode})]
    for label, cls, options in variants:
        try:
            runners[label] = cls(model_name, args.scale, args.device, args.steps, **options)
        except Exception as exc:  # noqa: BLE001 - report and continue with the other variants
            _not_run(model_name, label, exc)
    # Memory: the first warm-up epoch's peak above what was allocated before it (activations, gradients,
    # optimizer state, workspaces; not the weights and batches every variant holds). Captured steps
    # allocate from their graph's own pool, which neither counter sees: eager variants only.
    training_bytes: dict[str, int | None] = {}
    for label, r in list(runners.items()):
        base = r.memory_in_use()
        r.reset_peak()
        try:
            for _ in range(max(args.warmup, 1)):
                r.epoch()  # torch.compile compiles here, at the first call: its errors surface here too
        except Exception as exc:  # noqa: BLE001 - report and continue with the other variants
            _not_run(model_name, label, exc)
            del runners[label]
            continue
        peak = r.peak_memory()
        eager = label in ("flowgraph", "torch")
        training_bytes[label] = peak - base if eager and base is not None and peak is not None else None
    rounds: dict[str, list[float]] = {k: [] for k in runners}
    order = list(runners)
    for rnd in range(args.rounds):
        seq = order if rnd % 2 == 0 else list(reversed(order))
        for label in seq:
            times = [runners[label].epoch() for _ in range(args.epochs)]
            rounds[label].append(statistics.median(times) * 1e3)
    result = {"model": model_name, "scale": args.scale}
    for label, vals in rounds.items():
        result[label] = {"median_ms": statistics.median(vals), "min_ms": min(vals), "max_ms": max(vals),
                         "training_peak_bytes": training_bytes[label]}
    return result


def _not_run(model_name: str, label: str, exc: Exception) -> None:
    """Say on stderr that one variant of one model could not run, and why (its column then reads nan)."""
    print(f"  {model_name}/{label}: could not run ({type(exc).__name__}: {exc})", file=sys.stderr)


def loss_agreement(model_name: str, scale: float, device: str, steps: int = 20) -> float:
    """Max relative difference of the first ``steps`` losses from identical weights and batches."""
    import numpy as np
    import torch

    from flowgraph import optim

    tm = build_torch(model_name, scale)
    fm = build_flowgraph(model_name, scale)
    copy_torch_weights(fm, tm)
    # Dropout masks come from each framework's own generator: the check turns dropout off on both sides.
    for m in list(tm.modules()) + list(fm.modules()):
        if type(m).__name__ == "Dropout":
            m.p = 0.0
    fm = fm.to(device)
    tdev = "cuda" if device.startswith("cuda") or (device.startswith("opencl") and torch.cuda.is_available()) \
        else "cpu"
    tm = tm.to(tdev)
    topt = torch.optim.Adam(tm.parameters(), lr=1e-3)
    fopt = optim.Adam(fm.parameters(), lr=1e-3)
    sp = spec(model_name, scale)
    rng = np.random.default_rng(2)
    worst = 0.0
    # cuDNN convolutions default to TF32 on Ampere and newer (10-bit mantissa), in both frameworks: compare in
    # full float32 (the rule: the loss check runs with both TF32 flags off).
    import flowgraph as fg

    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    fg_tf32 = fg.backends.cudnn.allow_tf32, fg.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    fg.backends.cudnn.allow_tf32 = fg.backends.cuda.matmul.allow_tf32 = False
    try:
        worst = _compare_losses(tm, fm, topt, fopt, sp, rng, steps, device, tdev)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
        fg.backends.cudnn.allow_tf32, fg.backends.cuda.matmul.allow_tf32 = fg_tf32
    return worst


def _compare_losses(tm, fm, topt, fopt, sp, rng, steps: int, device: str, tdev: str) -> float:
    """Max relative difference of ``steps`` losses, torch model ``tm`` against flowgraph model ``fm``."""
    import numpy as np
    import torch

    import flowgraph as fg
    from flowgraph import nn

    worst = 0.0
    for _ in range(steps):
        x = rng.standard_normal(sp.input_shape, dtype=np.float32)
        y = rng.standard_normal(sp.target_shape, dtype=np.float32)
        tl = torch.nn.functional.mse_loss(tm(torch.tensor(x, device=tdev)), torch.tensor(y, device=tdev))
        topt.zero_grad()
        tl.backward()
        topt.step()
        fl = nn.functional.mse_loss(fm(fg.tensor(x, device=device)), fg.tensor(y, device=device))
        fopt.zero_grad()
        fl.backward()
        fopt.step()
        a, b = float(tl.item()), float(fl.item())
        worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    return worst


def environment(device: str) -> dict:
    """Hardware and versions for the report."""
    import numpy as np
    import torch

    env = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
           "machine": platform.machine(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "device": device}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
        try:
            import cupy

            env["cupy"] = cupy.__version__
        except ImportError:
            pass
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, opencl, opencl:0 ...")
    parser.add_argument("--models", default="all", help="comma-separated subset of: " + ", ".join(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per round")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up epochs per framework")
    parser.add_argument("--steps", type=int, default=50, help="batches per epoch")
    parser.add_argument("--scale", type=float, default=None,
                        help="width/batch scale (default 1.0 on GPUs, 0.25 on the CPU)")
    parser.add_argument("--jit", "--capture", dest="capture", action="store_true",
                        help="also time fg.jit steps (and torch CUDA graphs on cuda)")
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile's step (where it runs: Inductor needs a C++ compiler on the "
                             "CPU, Triton on the GPU; compiling takes tens of seconds a model)")
    parser.add_argument("--compile-mode", default="default",
                        help="torch.compile's mode for --compile: default, reduce-overhead (CUDA graphs), ...")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    parser.add_argument("--check-losses", action="store_true", help="run the same-initial-weights loss check")
    parser.add_argument("--json", default=None, help="write all results to this file")
    args = parser.parse_args(argv)
    if args.scale is None:
        args.scale = 0.25 if args.device == "cpu" else 1.0
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    names = MODELS if args.models == "all" else tuple(m.strip() for m in args.models.split(","))
    env = environment(args.device)
    print(f"# {env}")
    print(f"# scale={args.scale} steps/epoch={args.steps} rounds={args.rounds} timed epochs/round={args.epochs}")
    results = []
    header = f"{'model':<18}{'flowgraph ms':>14}{'torch ms':>12}{'ratio':>8}{'spread fg':>18}"
    if args.capture:
        header += f"{'fg jit':>10}{'jit/torch':>10}{'torch graph':>13}{'ratio':>8}"
    if args.compile:  # flowgraph's fastest timed step against torch.compile's
        header += f"{'torch compile':>15}{'jit/compile' if args.capture else 'fg/compile':>13}"
    if args.check_losses:
        header += f"{'loss rel diff':>15}"
    header += f"{'fg MiB':>9}{'torch MiB':>10}"
    print(header)
    for name in names:
        r = time_model(name, args)
        if args.check_losses:
            r["loss_rel_diff"] = loss_agreement(name, args.scale, args.device)
        results.append(r)
        fgm = r.get("flowgraph", {}).get("median_ms", float("nan"))
        tm = r.get("torch", {}).get("median_ms", float("nan"))
        spread = r.get("flowgraph", {})
        line = (f"{name:<18}{fgm:>14.1f}{tm:>12.1f}{fgm / tm:>8.2f}"
                f"{spread.get('min_ms', float('nan')):>9.1f}-{spread.get('max_ms', float('nan')):<8.1f}")
        if args.capture:
            fc = r.get("flowgraph_jit", {}).get("median_ms", float("nan"))
            tg = r.get("torch_graph", {}).get("median_ms", float("nan"))
            line += f"{fc:>10.1f}{fc / tm:>10.2f}{tg:>13.1f}{fc / tg:>8.2f}"
        if args.compile:
            tc = r.get("torch_compile", {}).get("median_ms", float("nan"))
            ours = r.get("flowgraph_jit" if args.capture else "flowgraph", {}).get("median_ms", float("nan"))
            line += f"{tc:>15.1f}{ours / tc:>13.2f}"
        if args.check_losses:
            line += f"{r['loss_rel_diff']:>15.2e}"
        mem = [r.get(k, {}).get("training_peak_bytes") for k in ("flowgraph", "torch")]
        line += "".join(f"{m / 2**20:>{w}.0f}" if m is not None else f"{'-':>{w}}" for m, w in zip(mem, (9, 10)))
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"environment": env, "args": vars(args), "results": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
