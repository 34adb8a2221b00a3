#!/usr/bin/env bash
# One device session on NVIDIA GPUs: the backend-parametrised suite on cuda and on NVIDIA's OpenCL driver, the
# NCCL test (2 GPUs), the 7-model benchmark (CUDA eager + fg.jit vs torch eager + CUDA graph; OpenCL eager + jit),
# data-parallel equality and scaling (2 GPUs), and a kernel profile of mlp.
# Results land in $OUT (or ./out). Run from the repository root:  bash benchmarks/gpu_session.sh
# Each stage has a time budget (seconds, environment): TEST_BUDGET, CUDA_BENCH_BUDGET, OCL_BENCH_BUDGET, DP_BUDGET.
# STAGES picks stages (default: all): tests bench compile dp profile overhead memory cpu kernels replay gc hostcost.
set -u
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
if [ -d .whl ]; then  # wheels carried to a machine without network (see CONTRIBUTING.md)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
# CuPy finds NCCL through the loader: use the copy that came with torch's wheels when there is one.
NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$NCCL_LIB" ] && export LD_LIBRARY_PATH="$NCCL_LIB:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0  # NVLink multicast off, as the device notes require
# NVIDIA's OpenCL driver is installed but not registered with the ICD loader on these hosts.
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
cp /etc/OpenCL/vendors/*.icd /tmp/icd/ 2>/dev/null || true
export OCL_ICD_VENDORS=/tmp/icd POCL_CACHE_DIR=/tmp/pocl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -c "import flowgraph as fg, cupy, torch; print(fg.available_devices(), cupy.__version__, torch.__version__)" \
  > "$OUT/devices.txt" 2>&1
STAGES="${STAGES:-tests bench compile dp profile overhead memory cpu kernels replay gc hostcost}"
has() { case " $STAGES " in *" $1 "*) return 0;; esac; return 1; }
SEVEN=mlp,convnet,gru_seq,residual_tower,gated_routing,iterative_refine,feedback_fixed
TESTS="tests/backends tests/tensor tests/autograd tests/nn tests/optim tests/builder tests/tree tests/runtime tests/utils"
if has tests; then
timeout "${TEST_BUDGET:-150}" python3 -m pytest $TESTS -q -k "cuda" -n 16 -p no:cacheprovider \
  > "$OUT/tests_cuda.txt" 2>&1
timeout "${TEST_BUDGET:-150}" python3 -m pytest $TESTS -q -k "opencl" -n 16 -p no:cacheprovider \
  > "$OUT/tests_opencl.txt" 2>&1
timeout 60 python3 -m pytest tests/distributed -q -rs -p no:cacheprovider > "$OUT/tests_distributed.txt" 2>&1
fi
if has gc; then  # Python's cyclic collector during eager steps (docs/cuda.md)
  timeout 120 python3 -m benchmarks.gc_collections --device cuda --models all --steps 200 > "$OUT/gc_cuda.txt" 2>&1
fi
if has overhead; then
  python3 benchmarks/overhead.py --device cuda --ops 1000 --repeats 7 > "$OUT/overhead_cuda.txt" 2>&1
  python3 benchmarks/overhead.py --ops 1000 --repeats 7 > "$OUT/overhead_cpu.txt" 2>&1
fi
if has bench; then
timeout "${CUDA_BENCH_BUDGET:-300}" python3 -m benchmarks --device cuda --models all --capture --check-losses \
  --rounds 2 --epochs 2 --json "$OUT/bench_cuda.json" > "$OUT/bench_cuda.txt" 2>&1
timeout "${OCL_BENCH_BUDGET:-200}" python3 -m benchmarks --device opencl:0 --models all --jit --rounds 1 --epochs 2 \
  --json "$OUT/bench_opencl.json" > "$OUT/bench_opencl.txt" 2>&1
fi
if has compile; then  # torch.compile's step (Inductor + Triton; tens of seconds of compiling a model) against fg.jit
timeout "${COMPILE_BUDGET:-540}" python3 -m benchmarks --device cuda --models "${COMPILE_MODELS:-$SEVEN}" \
  --capture --compile --rounds 2 --epochs 2 --json "$OUT/bench_cuda_compile.json" > "$OUT/bench_cuda_compile.txt" 2>&1
fi
if has dp; then
DP="python3 -m flowgraph.distributed.run"
timeout "${DP_BUDGET:-60}" $DP --nproc-per-node 2 -m benchmarks.data_parallel --check --optimizer sgd --model mlp \
  > "$OUT/data_parallel.txt" 2>&1
for m in mlp residual_tower; do for c in "" "--jit" "--torch"; do for n in 1 2; do  # --torch: PyTorch's DDP
  timeout "${DP_BUDGET:-60}" $DP --nproc-per-node $n --master-port $((29540 + n)) -m benchmarks.data_parallel \
    --bench $c --model $m --epochs 3 --json "$OUT/data_parallel.jsonl" >> "$OUT/data_parallel.txt" 2>&1
done; done; done
# the kernels and NCCL calls of both ranks on one axis (docs/distributed.md), and ZeRO-1's state per rank
timeout "${DP_BUDGET:-60}" $DP --nproc-per-node 2 --master-port 29550 -m benchmarks.dp_timeline --model mlp --jit \
  --out "$OUT/dp_timeline" >> "$OUT/data_parallel.txt" 2>&1
timeout "${DP_BUDGET:-60}" $DP --nproc-per-node 2 --master-port 29551 -m benchmarks.zero_memory --model mlp \
  --device cuda >> "$OUT/data_parallel.txt" 2>&1
fi
if has cpu; then  # the 7 models on the host CPU, eager and fg.jit vs torch (CPU scale)
  timeout "${CPU_BENCH_BUDGET:-240}" python3 -m benchmarks --device cpu --models "${CPU_MODELS:-all}" --jit --check-losses \
    --rounds 2 --epochs 1 --json "$OUT/bench_cpu.json" > "$OUT/bench_cpu.txt" 2>&1
  # makemore MLP and a small GPT at batch 32, two threads on both sides (the project's machines have 2 cores)
  OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 timeout 120 python3 benchmarks/ports.py --threads 2 --steps 20 \
    --rounds 5 > "$OUT/ports_cpu.txt" 2>&1
fi
if has memory; then  # activation checkpointing: peak memory and time, flowgraph and torch.utils.checkpoint
  timeout "${MEM_BUDGET:-120}" python3 benchmarks/activation_checkpoint.py --device cuda --steps 5 \
    > "$OUT/activation_checkpoint_cuda.txt" 2>&1
  timeout "${MEM_BUDGET:-120}" python3 benchmarks/activation_checkpoint.py --device cuda --steps 5 --scale 0.5 \
    --batch 2048 >> "$OUT/activation_checkpoint_cuda.txt" 2>&1
fi
if has kernels; then  # cuDNN attention against torch's, kernel launches per step
  for c in "--causal" ""; do
    timeout 90 python3 -m benchmarks.attention --device cuda --shape 8,16,2048,64 --dtype float16 $c \
      >> "$OUT/attention_cuda.txt" 2>&1
  done
  timeout 60 python3 -m benchmarks.attention --device cuda --shape 8,16,2048,64 --dtype float16 --causal --no-cudnn \
    >> "$OUT/attention_cuda.txt" 2>&1
  timeout 90 python3 -m benchmarks.launches --device cuda --scale 1.0 > "$OUT/launches_cuda.txt" 2>&1
fi
has replay && timeout 120 python3 -m benchmarks.jit_replay --models "${REPLAY_MODELS:-gated_routing,mlp,convnet}" \
  > "$OUT/jit_replay_cuda.txt" 2>&1
has hostcost && timeout 180 python3 -m benchmarks.host_cost --device cuda --scale 1.0 --by-backend-call 15 \
  > "$OUT/host_cost_cuda.txt" 2>&1  # bytecodes and calls of one eager step, flowgraph and torch (deterministic)
has profile && timeout 60 python3 -m benchmarks.gpu_profile --models "${PROFILE_MODELS:-mlp}" --steps 3 \
  > "$OUT/profile_cuda.txt" 2>&1
tail -n 2 "$OUT"/tests_*.txt "$OUT"/overhead_*.txt 2>/dev/null; cat "$OUT"/bench_*.txt "$OUT"/host_cost_*.txt 2>/dev/null
cat "$OUT"/activation_checkpoint_cuda.txt "$OUT"/ports_cpu.txt "$OUT"/attention_cuda.txt "$OUT"/launches_cuda.txt \
  2>/dev/null
grep -E "^(check|bench|rank|\\|)" "$OUT/data_parallel.txt" 2>/dev/null
