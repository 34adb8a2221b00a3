#!/usr/bin/env bash
# One device session on an NVIDIA GPU: the backend-parametrised suite on cuda and on NVIDIA's OpenCL driver,
# then the 7-model benchmark (CUDA eager + captured vs torch eager + CUDA graph; OpenCL vs torch).
# Results land in $OUT (or ./out). Run from the repository root:  bash benchmarks/gpu_session.sh
set -u
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
# NVIDIA's OpenCL driver is installed but not registered with the ICD loader on these hosts.
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
cp /etc/OpenCL/vendors/*.icd /tmp/icd/ 2>/dev/null || true
export OCL_ICD_VENDORS=/tmp/icd POCL_CACHE_DIR=/tmp/pocl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import flowgraph as fg, cupy, torch; print(fg.available_devices(), cupy.__version__, torch.__version__)" \
  > "$OUT/devices.txt" 2>&1
TESTS="tests/backends tests/tensor tests/autograd tests/nn tests/optim tests/builder tests/tree"
timeout "${TEST_BUDGET:-150}" python3 -m pytest $TESTS -q -k "cuda" -n 12 -p no:cacheprovider \
  > "$OUT/tests_cuda.txt" 2>&1
timeout "${TEST_BUDGET:-150}" python3 -m pytest $TESTS -q -k "opencl" -n 12 -p no:cacheprovider \
  > "$OUT/tests_opencl.txt" 2>&1
timeout "${CUDA_BENCH_BUDGET:-200}" python3 -m benchmarks --device cuda --capture --check-losses --rounds 2 --epochs 2 \
  --json "$OUT/bench_cuda.json" > "$OUT/bench_cuda.txt" 2>&1
timeout "${OCL_BENCH_BUDGET:-120}" python3 -m benchmarks --device opencl --rounds 1 --epochs 2 \
  --json "$OUT/bench_opencl.json" > "$OUT/bench_opencl.txt" 2>&1
tail -n 3 "$OUT"/tests_*.txt; cat "$OUT"/bench_*.txt
