"""What verifying checkpoint checksums costs: load a ~100 MB checkpoint with and without its checksums.

    python benchmarks/checkpoint_integrity.py [--mb 100] [--rounds 5]

Prints the best load time of each (rounds interleaved) and the ratio; the goal is < 5% extra.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from flowgraph import nn  # noqa: E402
from flowgraph.tree import checkpoint as ckpt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    side = int((args.mb * 2**20 / 4 / 4) ** 0.5)  # four square float32 weights
    model = nn.Sequential(*[nn.Linear(side, side, bias=False) for _ in range(4)])
    with tempfile.TemporaryDirectory() as tmp:
        checked = os.path.join(tmp, "checked.safetensors")
        plain = os.path.join(tmp, "plain.safetensors")
        ckpt.save_checkpoint(model, checked)
        from safetensors import safe_open
        from safetensors.numpy import save

        with safe_open(checked, framework="numpy") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = {k: v for k, v in f.metadata().items() if k != "checksums"}
        with open(plain, "wb") as fh:
            fh.write(save(tensors, metadata=metadata))
        size = os.path.getsize(checked) / 2**20
        best = {"with checksums": 1e9, "without": 1e9}
        for _ in range(args.rounds):
            for name, path in (("with checksums", checked), ("without", plain)):
                t0 = time.perf_counter()
                ckpt.load_checkpoint(model, path)
                best[name] = min(best[name], time.perf_counter() - t0)
        t0 = time.perf_counter()
        for v in tensors.values():
            ckpt._checksum(v)
        alone = time.perf_counter() - t0
    print(f"checkpoint of {size:.0f} MB, best of {args.rounds}: load {best['without'] * 1000:.0f} ms without "
          f"checksums, {best['with checksums'] * 1000:.0f} ms verifying them (checksums alone {alone * 1000:.1f} ms)")
    print(f"ratio with/without: {best['with checksums'] / best['without']:.3f} (goal < 1.05); "
          f"checksum share of the load: {alone / best['with checksums']:.1%}")


if __name__ == "__main__":
    main()
