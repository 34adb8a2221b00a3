"""Kernel launches of one training step of a benchmark model (the benchmark protocol: MSE, Adam lr 1e-3).

    python -m benchmarks.launches --models mlp,residual_tower --scale 0.25
    python -m benchmarks.launches --models mlp --generic     # LayerNorm and Adam on the generic defaults
    python -m benchmarks.launches --device cuda --scale 1.0  # on an NVIDIA GPU (needs torch with CUDA)

On OpenCL every ``pyopencl.Kernel`` call is counted (elementwise, reductions, matmul, the row kernels, the
optimizer; host copies are not kernels); on CUDA every kernel CUPTI sees (``torch.profiler``, as
``benchmarks.gpu_profile`` reads them: CuPy's, cuBLAS's, the row kernels; not copies or memsets). One eager
step is counted after two warm-up steps (the first creates Adam's state).
``--generic`` swaps the OpenCL backend's ``layer_norm``, ``layer_norm_backward`` and ``adam_step_multi`` for
``Backend``'s generic defaults: the composed LayerNorm (reductions and fused elementwise kernels, as before
the row kernels) and one Adam launch per parameter, so the two runs show what the kernels save. Counts do not
depend on the scale except where a reduction is split over several work-groups per output.
"""

from __future__ import annotations

import argparse
import json

from .models import MODELS


def count_step(model_name: str, scale: float, device: str, generic: bool) -> dict[str, int]:
    """``{"step": launches of one eager training step, "forward": of its forward alone}``."""
    import numpy as np

    import flowgraph as fg
    from flowgraph import nn, optim
    from flowgraph.backends.base import Backend

    from .models import build_flowgraph, spec

    be = fg.get_backend(device)
    saved = {}
    if generic:
        for name in ("layer_norm", "layer_norm_backward", "adam_step_multi"):
            saved[name] = type(be).__dict__.get(name)
            setattr(type(be), name, getattr(Backend, name))
    try:
        fg.manual_seed(0)
        model = build_flowgraph(model_name, scale).to(device)
        opt = optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = nn.MSELoss()
        sp = spec(model_name, scale)
        rng = np.random.default_rng(1)
        x = fg.tensor(rng.standard_normal(sp.input_shape, dtype=np.float32), device=device)
        y = fg.tensor(rng.standard_normal(sp.target_shape, dtype=np.float32), device=device)

        def step() -> None:
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()

        def forward() -> None:
            with fg.no_grad():
                model(x).sum().item()

        for _ in range(2):
            step()
        be.synchronize()
        count = _count_cuda if device.startswith("cuda") else _count_opencl
        return {"step": count(step), "forward": count(forward) - 1}  # less the sum that made the output readable
    finally:
        for name, fn in saved.items():
            if fn is None:
                delattr(type(be), name)
            else:
                setattr(type(be), name, fn)


def _count_opencl(fn) -> int:
    """Kernel enqueues while ``fn()`` runs (every ``pyopencl.Kernel`` call)."""
    import pyopencl as cl

    calls = [0]
    original = cl.Kernel.__call__

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    cl.Kernel.__call__ = counted
    try:
        fn()
    finally:
        cl.Kernel.__call__ = original
    return calls[0]


def _count_cuda(fn) -> int:
    """CUDA kernels CUPTI records while ``fn()`` runs (copies and memsets left out)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA"
               and not e.key.startswith(("Memcpy", "Memset")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp", help=f"comma-separated, or 'all' ({', '.join(MODELS)})")
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--generic", action="store_true", help="LayerNorm and Adam on the generic defaults")
    parser.add_argument("--json", help="write the counts to this file")
    args = parser.parse_args()
    names = MODELS if args.models == "all" else tuple(args.models.split(","))
    results = {}
    for name in names:
        results[name] = count_step(name, args.scale, args.device, args.generic)
        print(f"{name:18s} step {results[name]['step']:5d} launches   forward {results[name]['forward']:5d}"
              + ("   (generic LayerNorm/Adam)" if args.generic else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "scale": args.scale, "generic": args.generic, "counts": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
