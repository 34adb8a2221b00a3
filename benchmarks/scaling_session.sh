#!/usr/bin/env bash
# The 4- and 8-GPU scaling run of issue #22 in one device call (a kind with 4 or 8 GPUs on one host):
# benchmarks/data_parallel for mlp and residual_tower, eager and fg.jit, at 1, 2, 4 (and 8) GPUs, then the NCCL
# equality check at the largest world size, then the table (samples/s and scaling efficiency) into $OUT.
#   OUT=out bash benchmarks/scaling_session.sh            # from the repository root
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the device tool's notes require.
set -u
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$NCCL_LIB" ] && export LD_LIBRARY_PATH="$NCCL_LIB:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
DP="python3 -m flowgraph.distributed.run"
: > "$OUT/scaling.jsonl"
for m in mlp residual_tower; do for j in "" "--jit"; do for n in 1 2 4 8; do
  [ "$n" -le "$GPUS" ] || continue
  timeout "${RUN_BUDGET:-90}" $DP --nproc-per-node $n --master-port $((29600 + n)) -m benchmarks.data_parallel \
    --bench $j --model $m --epochs 3 --json "$OUT/scaling.jsonl" >> "$OUT/scaling.txt" 2>&1
done; done; done
timeout "${RUN_BUDGET:-90}" $DP --nproc-per-node "$GPUS" -m benchmarks.data_parallel --check --optimizer sgd \
  --model mlp >> "$OUT/scaling.txt" 2>&1
python3 - "$OUT/scaling.jsonl" > "$OUT/scaling_table.md" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
base = {(r["model"], r["capture"]): r["samples_per_s"] for r in rows if r["world"] == 1}
print("| model | mode | GPUs | samples/s | speed-up | efficiency |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for r in sorted(rows, key=lambda r: (r["model"], r["capture"], r["world"])):
    one = base.get((r["model"], r["capture"]))
    up = r["samples_per_s"] / one if one else float("nan")
    print(f"| {r['model']} | {'jit' if r['capture'] else 'eager'} | {r['world']} | {r['samples_per_s']:,.0f} | "
          f"{up:.2f} | {up / r['world']:.0%} |")
PY
cat "$OUT/scaling_table.md"; grep -E "^check" "$OUT/scaling.txt"
