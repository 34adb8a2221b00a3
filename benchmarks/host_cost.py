"""Host work of one eager training step, counted instead of timed: Python bytecodes executed, Python calls and
C calls (builtins, extension methods), flowgraph against torch in the same process.

    python -m benchmarks.host_cost                                 # cpu, the seven models, scale 0.25
    python -m benchmarks.host_cost --device opencl:0 --by-function 25 --models gated_routing
    python -m benchmarks.host_cost --device cuda --scale 1.0      # on an NVIDIA GPU
    python -m benchmarks.host_cost --device opencl:0 --by-backend-call 20 --models convnet --no-torch

Why counts: an eager step on an accelerator is bound by the host (docs/benchmark.md), and the host's speed
moves a timed step by 1.5x within one process on a shared machine, flowgraph's more than torch's (its step is
more Python). The number of bytecodes a step executes does not move with the machine: two runs of the same
command on the same code give the same counts. Runs in other states (another model first, warm or cold
caches, the collector freeing arrays at another moment, which prunes the lazy engine's reader lists) moved a
step's count by up to about 1.5%, so smaller differences are not changes. The kernels' own work is not
counted (a device step's time is these counts at the host's speed plus the library calls). torch's step
is counted the same way: its Python layers (``nn.Module.__call__``, the optimizer, autograd's Python entry
points) against flowgraph's, with everything under them in C++.

Counting uses ``sys.monitoring`` (Python 3.12 on) or ``sys.settrace`` with opcode events (3.11): a counted
step runs 20-50x slower than a plain one, so only one step is counted, after two warm-up steps (the first
creates Adam's state and compiles kernels). Also counted: the per-op chain of ``benchmarks.overhead`` (a
forward and backward of 200 tiny ops), per op.
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from typing import Any

from .models import MODELS

SEVEN = ["mlp", "convnet", "gru_seq", "residual_tower", "gated_routing", "iterative_refine", "feedback_fixed"]


def _where(code: Any) -> str:
    name = code.co_filename
    for marker in ("/flowgraph/", "/torch/"):
        if marker in name:
            name = marker.strip("/") + "/" + name.split(marker, 1)[1]
            break
    return f"{name}:{code.co_name}"


def backend_call(frame: Any) -> str:
    """Where a bytecode executing in ``frame`` is charged by ``--by-backend-call``: ``backend:NAME`` for the
    outermost flowgraph backend method on the stack (everything a backend call runs, its lazy engine and
    kernel launches included, is that call's), else the function itself (``_where``)."""
    outer = None
    f = frame
    while f is not None:
        if "/flowgraph/backends/" in f.f_code.co_filename:
            outer = f
        f = f.f_back
    return _where(frame.f_code) if outer is None else f"backend:{outer.f_code.co_name}"


def count(fn: Callable[[], Any], by_function: bool = False,
          by_backend_call: bool = False) -> tuple[int, int, int, collections.Counter]:
    """``(bytecodes, python_calls, c_calls, per_place_bytecodes)`` of one call of ``fn``: per function with
    ``by_function``, per outermost backend call (``backend_call``) with ``by_backend_call``."""
    per: collections.Counter = collections.Counter()
    if sys.version_info >= (3, 12):
        return _count_monitoring(fn, by_function, by_backend_call, per)
    ops, calls = [0], [0, 0]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            ops[0] += 1
            if by_backend_call:
                per[backend_call(frame)] += 1
            elif by_function:
                per[_where(frame.f_code)] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
        return tracer

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1
        elif event == "c_call":
            calls[1] += 1

    sys.settrace(tracer)
    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return ops[0], calls[0], calls[1], per


def _count_monitoring(fn: Callable[[], Any], by_function: bool, by_backend_call: bool,
                      per: collections.Counter) -> tuple:
    mon = sys.monitoring
    tool = mon.PROFILER_ID
    events = mon.events
    counts = [0, 0, 0]
    python_code = type(_count_monitoring.__code__)
    getframe = sys._getframe

    def instruction(code: Any, offset: int) -> None:
        counts[0] += 1
        if by_backend_call:
            per[backend_call(getframe(1))] += 1  # the frame executing ``code``
        elif by_function:
            per[_where(code)] += 1

    def start(code: Any, offset: int) -> None:
        counts[1] += 1

    def call(code: Any, offset: int, callable_: Any, arg0: Any) -> None:
        if type(getattr(callable_, "__code__", None)) is not python_code:
            counts[2] += 1

    mon.use_tool_id(tool, "flowgraph.host_cost")
    try:
        mon.register_callback(tool, events.INSTRUCTION, instruction)
        mon.register_callback(tool, events.PY_START, start)
        mon.register_callback(tool, events.CALL, call)
        mon.set_events(tool, events.INSTRUCTION | events.PY_START | events.CALL)
        try:
            fn()
        finally:
            mon.set_events(tool, 0)
    finally:
        mon.free_tool_id(tool)
    return counts[0], counts[1], counts[2], per


def flowgraph_step(name: str, scale: float, device: str) -> Callable[[], Any]:
    """One eager training step of ``name`` (the benchmark protocol), after two warm-up steps."""
    from .models import flowgraph_training

    return _warmed_step(*flowgraph_training(name, scale, device))


def _warmed_step(model: Any, opt: Any, x: Any, y: Any, loss_fn: Any) -> Callable[[], Any]:
    """A training step of either framework (the same calls in both), run twice: the first creates the
    optimizer's state and compiles kernels, the second is a step like every later one."""

    def step() -> None:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    step()
    return step


def torch_step(name: str, scale: float, device: str) -> Callable[[], Any] | None:
    """The same step in torch (CUDA for cuda and opencl devices where torch has it, else CPU), or None."""
    try:
        import torch
    except ImportError:
        return None
    from .models import build_torch, spec

    dev = "cuda" if not device.startswith("cpu") and torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = build_torch(name, scale).to(dev)
    sp = spec(name, scale)
    return _warmed_step(model, torch.optim.Adam(model.parameters(), lr=1e-3), torch.randn(sp.input_shape, device=dev),
                        torch.randn(sp.target_shape, device=dev), torch.nn.MSELoss())


def chain(device: str, n_ops: int = 200) -> Callable[[], Any]:
    """``benchmarks.overhead``'s chain: ``n_ops`` tiny elementwise ops with a parameter, forward and backward."""
    import numpy as np

    import flowgraph as fg

    from .overhead import _chain

    x = fg.tensor(np.ones(64, np.float32), device=device)
    w = fg.full((64,), 0.999, dtype=fg.float32, device=device, requires_grad=True)

    def run() -> None:
        w.grad = None
        _chain(x, w, n_ops).sum().backward()

    run()
    run()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=",".join(SEVEN), help=f"comma-separated, from {MODELS}")
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--by-function", type=int, default=0, metavar="N",
                        help="also print the N functions that execute the most bytecodes (flowgraph's step)")
    parser.add_argument("--by-backend-call", type=int, default=0, metavar="N",
                        help="also print the N places that execute the most bytecodes, each backend call with "
                             "everything under it (lazy engine, launches) as one place (flowgraph's step)")
    parser.add_argument("--no-torch", action="store_true", help="count flowgraph only")
    args = parser.parse_args(argv)

    n_ops = 200
    ops, py, c, _ = count(chain(args.device, n_ops))
    print(f"# host work counted, not timed: {sys.version.split()[0]}, device {args.device}, scale {args.scale}")
    print(f"per op of the overhead chain (fwd+bwd): {ops / n_ops:.0f} bytecodes, {py / n_ops:.1f} Python calls, "
          f"{c / n_ops:.1f} C calls")
    print(f"{'model':18s} {'fg bytecodes':>12s} {'py calls':>9s} {'C calls':>8s} | {'torch bytecodes':>15s} "
          f"{'py calls':>9s} {'C calls':>8s} | {'bytecodes fg/torch':>18s}")
    for name in [m for m in args.models.split(",") if m]:
        ops, py, c, per = count(flowgraph_step(name, args.scale, args.device), args.by_function > 0,
                                args.by_backend_call > 0)
        tstep = None if args.no_torch else torch_step(name, args.scale, args.device)
        if tstep is not None:
            t_ops, t_py, t_c, _ = count(tstep)
            ratio = f"{ops / max(t_ops, 1):18.1f}"
            torch_cols = f"{t_ops:15d} {t_py:9d} {t_c:8d}"
        else:
            ratio, torch_cols = f"{'-':>18s}", f"{'-':>15s} {'-':>9s} {'-':>8s}"
        print(f"{name:18s} {ops:12d} {py:9d} {c:8d} | {torch_cols} | {ratio}", flush=True)
        if args.by_backend_call:
            inside = sum(n for where, n in per.items() if where.startswith("backend:"))
            print(f"    {inside:9d}  inside backend calls ({100 * inside / max(ops, 1):.0f}%)")
        for where, n in per.most_common(max(args.by_function, args.by_backend_call)):
            print(f"    {n:9d}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
