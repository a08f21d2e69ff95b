#!/usr/bin/env bash
# One batched session on a GPU host (device time is scarce): GPU tests, kernel accuracy, the attention benchmark,
# the default `ditprof compare`, `ditprof validate`, the SP path at P=1. Everything lands under $OUT (or ./gpu-out).
# Usage (repo root, after `source install-bundle.sh .gpu-bundle` on a host without a package index):
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh kernels   # tests + accuracy + attention benchmark
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh harness   # compare / validate / sp / accuracy-table
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() {  # step NAME TIMEOUT_S CMD...: run, keep the log, print a one-line status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%-22s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -v '^USDT' "$out/$name.log" | tail -n 1 | cut -c1-110)" | tee -a "$out/summary.txt"
}
case "${1:-kernels}" in
kernels)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
  step gpu-tests 300 python -m pytest -q -m gpu -p no:cacheprovider
  step kernels-accuracy 120 python -m ditprof kernels accuracy --device cuda --json
  step attention-bench 240 python benchmarks/attention.py --shapes h3 --json "$out/attention.json"
  ;;
harness)
  step compare-h3 300 python -m ditprof compare --out "$out/compare-h3"
  step validate-h3 300 python -m ditprof validate --preset h3 --blocks 50 --device cuda --steps 50 --cfg --out "$out/validate-h3"
  step compare-16g 200 python -m ditprof compare --preset h3 --gpu-memory 16GiB --out "$out/compare-h3-16g"
  step sp1-nccl 120 python -m ditprof compare --preset h3-mini --device cuda --sp 1 --out "$out/sp1"
  step accuracy-table 200 python -m ditprof accuracy-table --device cuda --tokens 4096 --out "$out/accuracy-table"
  ;;
esac
# at most 8 files come back: pack the folders
( cd "$out" && for d in */; do [ -d "$d" ] && tar czf "${d%/}.tgz" "$d" && rm -rf "$d"; done; tar czf logs.tgz *.log gpu.txt 2>/dev/null; rm -f *.log ) 
cat "$out/summary.txt"
