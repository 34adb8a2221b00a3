"""``import flowgraph`` wall time (best of N fresh interpreters) and which subpackages it loads.

    python benchmarks/import_time.py            # best of 7
"""

from __future__ import annotations

import argparse
import subprocess
import sys

PROBE = (
    "import sys, time; t = time.perf_counter(); import flowgraph; dt = time.perf_counter() - t; "
    "print(dt); print(' '.join(sorted(m for m in sys.modules if m.startswith('flowgraph.') and m.count('.') == 1)))"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    times, loaded = [], ""
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
        first, loaded = out.strip().splitlines()
        times.append(float(first))
    print(f"import flowgraph: best {min(times) * 1000:.0f} ms, median {sorted(times)[len(times) // 2] * 1000:.0f} ms "
          f"over {args.runs} fresh interpreters (goal < 300 ms)")
    print(f"loaded: {loaded}")


if __name__ == "__main__":
    main()
