#!/usr/bin/env bash
# Batched work on a GPU host (device time is scarce). Everything lands under $OUT (or ./gpu-out).
# Usage (repo root, after `source install-bundle.sh .gpu-bundle` on a host without a package index):
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh ENTRY      # ENTRY: one of the case labels below (default main)
#   main, compare, extra, families, families2, qwen, families3, reliability, hta, op, compile, peers, graphs, host,
#   sp, sp-families, issue6: the harness and the shipped kernel; diag, final, sweep, timeline, lazy: the sm90 variants
#   (benchmarks/experimental/fp8_fwd_sm90_variants.py); prep-sweep, op-ab: the other kept experimental benches.
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() {  # step NAME TIMEOUT_S CMD...: run, keep the log, print a one-line status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%-18s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -v '^USDT' "$out/$name.log" | tail -n 1 | cut -c1-120)" | tee -a "$out/summary.txt"
}
timelines() {  # timelines OPTS...: one sm90_timeline.py run per kernel option set ("default" = no overrides)
  local o
  for o in "$@"; do
    [ "$o" = default ] && o=""
    step "timeline-${o:-default}" 200 python benchmarks/experimental/sm90_timeline.py --opts "$o" --out "$out/timeline"
  done
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
case "${1:-main}" in
families)  # the real MiniMax-H3 block's default compare, the accuracy table, 16 GiB feasibility, GPU tests
  step compare-h3 250 python -m ditprof compare --out "$out/compare-h3"
  step accuracy-table 260 python -m ditprof accuracy-table --device cuda --out "$out/accuracy-table"
  step feasibility 200 python benchmarks/feasibility.py --device cuda --json "$out/feasibility.json"
  step gpu-tests 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_validate.py tests/test_cuda_graph.py
  ;;
families2)  # h3 at the pipeline's own request size, 50 real blocks, the Wan 2.2 presets
  step compare-h3-768x1344x124 200 python -m ditprof compare --height 768 --width 1344 --frames 124 --out "$out/compare-h3-768"
  step validate-h3 260 python -m ditprof validate --preset h3 --blocks 50 --device cuda --steps 50 --out "$out/validate-h3"
  step feasibility-wan22 90 python benchmarks/feasibility.py --device cuda --presets wan2.2-t2v-a14b,wan2.2-ti2v-5b --json "$out/feasibility-wan22.json"
  ;;
qwen)  # the Qwen-Image family: compare, accuracy table, feasibility
  step compare-qwen-image 150 python -m ditprof compare --preset qwen-image --out "$out/compare-qwen-image"
  step accuracy-qwen-image 150 python -m ditprof accuracy-table --device cuda --presets qwen-image --out "$out/accuracy-qwen-image"
  step feasibility-qwen-image 90 python benchmarks/feasibility.py --device cuda --presets qwen-image --json "$out/feasibility-qwen-image.json"
  ;;
families3)  # FLUX.2, LTX-2, HunyuanVideo-1.5 (inputs captured from the model's own forward)
  step compare-flux2-double 200 python -m ditprof compare --preset flux.2-dev --out "$out/compare-flux2-double"
  step compare-flux2-single 150 python -m ditprof compare --preset flux.2-dev --kind single --out "$out/compare-flux2-single"
  step compare-ltx2 150 python -m ditprof compare --preset ltx-2 --out "$out/compare-ltx2"
  step compare-hv15 200 python -m ditprof compare --preset hunyuan-video-1.5 --out "$out/compare-hv15"
  step accuracy-new 200 python -m ditprof accuracy-table --device cuda --presets flux.2-dev,ltx-2 --out "$out/accuracy-new"
  step feasibility-new 150 python benchmarks/feasibility.py --device cuda --presets flux.2-dev,ltx-2,hunyuan-video-1.5 --json "$out/feasibility-new.json"
  ;;
reliability)  # the plan, noise verdicts and NaN checks on the GPU
  step compare-h3-plan 250 python -m ditprof compare --out "$out/compare-h3-plan"
  step compare-flux-plan 150 python -m ditprof compare --preset flux.1-dev --out "$out/compare-flux-plan"
  step refuse-16g 60 python -m ditprof profile --preset hunyuan-video --kind single --gpu-memory 8GiB --out "$out/refuse-16g"
  step gpu-tests 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_finite_checks.py tests/test_cuda_graph.py tests/test_validate.py
  ;;
hta)  # record a small GPU trace for the CI HTA test, run the GPU HTA test
  step record 120 python -m ditprof compare --preset h3-mini --tokens 1024 --device cuda --iters 3 --warmup 1 --no-cuda-graph --out "$out/rec"
  mkdir -p "$out/hta-data/h3-mini-h200-baseline" "$out/hta-data/h3-mini-h200-swapped"
  for r in baseline swapped; do gzip -c "$out"/rec/tb/$r/*.pt.trace.json > "$out/hta-data/h3-mini-h200-$r/$r.h200.pt.trace.json.gz"; done
  step hta-gpu-test 200 python -m pytest -q -p no:cacheprovider tests/test_hta.py tests/test_diff.py
  ;;
op)  # the custom op on the GPU (key masks vs float64, inductor), compile time, HunyuanVideo-1.5 with fp8
  step op-gpu-tests 250 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_op_gpu.py tests/test_fp8_kernel_gpu.py benchmarks/experimental/test_fp8_sm90_variants_gpu.py
  step compile-time 300 python benchmarks/compile_time.py --json "$out/compile-time.json"
  step compare-hv15-fp8 250 python -m ditprof compare --preset hunyuan-video-1.5 --out "$out/compare-hv15-fp8"
  ;;
compile)  # the blocks torch.compiled (fullgraph, default mode): compile time, the split with 'fused', sdpa -> fp8
  step compare-h3-compile 300 python -m ditprof compare --compile --iters 5 --out "$out/compare-h3-compile"
  step compare-flux-compile 150 python -m ditprof compare --compile --preset flux.1-dev --iters 5 --out "$out/compare-flux-compile"
  ;;
peers)  # ours vs FA3 FP8/BF16 and cuDNN at the issue's shapes in one process, then the flux compare
  step attention-peers 330 python benchmarks/attention.py --shapes ${PEER_SHAPES:-flux,ltx,h3,cogvideox} --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn,cudnn-fp8,prep-triton --json "$out/attention-peers.json"
  step compare-flux 200 python -m ditprof compare --preset flux.1-dev --out "$out/compare-flux"
  ;;
main)  # the default `ditprof compare` (h3, fp8) + validate 50 blocks
  step compare-h3 250 python -m ditprof compare --out "$out/compare-h3"
  step validate-h3 220 python -m ditprof validate --preset h3 --blocks 50 --device cuda --steps 50 --cfg --out "$out/validate-h3"
  ;;
extra)  # attention benchmark, kernel accuracy, --sp 1, 16 GiB, GPU tests
  step attention-bench 200 python benchmarks/attention.py --shapes h3 --iters 5 --json "$out/attention.json"
  step kernels-accuracy 60 python -m ditprof kernels accuracy --device cuda --json
  step sp1-nccl 60 python -m ditprof compare --preset h3-mini --device cuda --sp 1 --out "$out/sp1"
  step compare-16g 120 python -m ditprof compare --preset h3 --gpu-memory 16GiB --iters 5 --out "$out/compare-h3-16g"
  step gpu-tests 150 python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_fp8_kernel_gpu.py tests/test_validate.py tests/test_fp8_emulation.py
  ;;
diag)  # sm90 variants: option sweep + ncu (stall reasons per SASS line)
  step sweep 330 python benchmarks/experimental/sm90_sweep.py --out "$out" --rounds 2 --iters 6 ${SWEEP_VARIANTS:+--variants $SWEEP_VARIANTS}
  for v in ${NCU_VARIANTS:-default}; do
    step "ncu-$v" 150 ncu --clock-control none --set full --import-source no -k regex:Sm90Fp8 --launch-skip 1 \
      --launch-count 1 -f -o "$out/ncu-$v" python benchmarks/experimental/sm90_sweep.py --ncu-child "$v"
    ncu -i "$out/ncu-$v.ncu-rep" --page details --csv > "$out/ncu-$v-details.csv" 2>&1
    ncu -i "$out/ncu-$v.ncu-rep" --page source --csv --print-source sass > "$out/ncu-$v-sass.csv" 2>&1
    ncu -i "$out/ncu-$v.ncu-rep" --page raw --csv > "$out/ncu-$v-raw.csv" 2>&1
    rm -f "$out/ncu-$v.ncu-rep"
  done
  mkdir -p "$out/ncu" && mv "$out"/ncu-*.csv "$out/ncu/" 2>/dev/null
  ;;
final)  # sm90 variants' GPU tests + attention side by side (h3)
  step sm90-tests 300 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py
  step attention-bench 240 python benchmarks/attention.py --shapes h3 --iters 5 --json "$out/attention.json"
  ;;
compare)  # the default `ditprof compare` (h3) only
  step compare-h3 280 python -m ditprof compare --out "$out/compare-h3"
  ;;
sweep)  # sm90 variants' option sweep only (SWEEP_VARIANTS), then TIMELINE_OPTS
  step sweep 400 python benchmarks/experimental/sm90_sweep.py --out "$out" --rounds 2 --iters 6 ${SWEEP_VARIANTS:+--variants $SWEEP_VARIANTS}
  timelines ${TIMELINE_OPTS:-}
  ;;
graphs)  # CUDA-graph replay timing: GPU tests, then compare on h3 and on small blocks
  step graph-tests 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graph.py
  step compare-h3 250 python -m ditprof compare --out "$out/compare-h3"
  for p in ${GRAPH_PRESETS:-ltx-video flux.1-dev cogvideox-5b}; do
    step "compare-$p" 150 python -m ditprof compare --preset "$p" --out "$out/compare-$p"
  done
  ;;
host)  # host overhead per attention call (launch paths), then graph tests + small-block compares
  step host-overhead 200 python benchmarks/host_overhead.py --json "$out/host_overhead.json"
  step tvm-test 150 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py -k tvm_ffi
  step graph-tests 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graph.py
  for p in ${GRAPH_PRESETS:-ltx-video flux.1-dev}; do
    step "compare-$p" 150 python -m ditprof compare --preset "$p" --out "$out/compare-$p"
  done
  [ -n "${FINITE_TESTS:-}" ] && step finite-tests 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_finite_checks.py
  [ -n "${WITH_TESTS:-}" ] && step sm90-tests 300 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py tests/test_fp8_kernel_gpu.py tests/test_prep.py
  ;;
sp)  # Ulysses over NCCL: the default block (h3) at SP degree P (default 2), then the same block on one GPU
  P=${SP:-2}
  step "sp$P-h3" 330 python -m ditprof compare --device cuda --sp "$P" --out "$out/sp$P-h3"
  step sp1-h3 250 python -m ditprof compare --device cuda --out "$out/sp1-h3"
  ;;
sp-families)  # --sp P for the other families' presets
  P=${SP:-2}
  for p in ${SP_PRESETS:-flux.1-dev ltx-video cogvideox-5b wan2.1-t2v-1.3b}; do
    step "sp$P-$p" 200 python -m ditprof compare --preset "$p" --device cuda --sp "$P" --iters 5 --out "$out/sp$P-$p"
  done
  ;;
timeline)  # sm90 variants: in-kernel clock trace (TIMELINE_OPTS="default k=v,k=v")
  timelines ${TIMELINE_OPTS:-default}
  ;;
lazy)  # sm90 variants: lazy_max / pv_split=1 sweep + timelines (LAZY_TESTS=1: the lazy_max GPU tests instead)
  if [ -n "${LAZY_TESTS:-}" ]; then
    step lazy-tests 400 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py -k "lazy or vs_float64 or biased"
  else
    step sweep 330 python benchmarks/experimental/sm90_sweep.py --out "$out" --rounds 2 --iters 6 --variants ${SWEEP_VARIANTS:-default,lazy,split1,lazy-split1}
    timelines ${TIMELINE_OPTS:-lazy_max=True}
  fi
  ;;
issue6)  # accuracy table with the fp8 row, 16 GiB feasibility, the sm90 variants' GPU tests
  step accuracy-table 330 python -m ditprof accuracy-table --device cuda --out "$out/accuracy-table"
  step feasibility 300 python benchmarks/feasibility.py --device cuda --json "$out/feasibility-cuda.json"
  step sm90-tests 240 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py
  ;;
prep-sweep)  # the INT8 prep's layouts and tiling at h3 with the whole call and the kernel alone (NOTES "Session 10"), then interleaved knob settings (PREP_SETTINGS, PrepConfig fields)
  step prep-int8-sweep 330 python benchmarks/experimental/prep_int8_sweep.py --iters 10 --end-to-end --json "$out/prep-int8-sweep.json"
  step prep-interleaved 240 python benchmarks/experimental/prep_tiling_interleaved.py --rounds 30 \
    --settings "${PREP_SETTINGS:-no_rot_tail=stats_rot_tail=False;v_mult1=stats_v_mult=1}" --json "$out/prep-interleaved.json"
  ;;
op-ab)  # the op's A/B benches, options against the default (NOTES "Session 18", "Session 21", "Session 22", "Session 23"), then one call's launches
  step qrot-op-ab 200 python benchmarks/experimental/qrot_op_ab.py --shapes cogvideox,wan1.3b,h3 --rounds 15 --json "$out/qrot-op-ab.json"
  step preset-bench 230 python benchmarks/experimental/mma_preset_bench.py --shapes flux,wan1.3b,h3 --rounds 15 --json "$out/mma-preset-bench.json"
  step graph-op-ab 200 python benchmarks/experimental/graph_op_ab.py --shapes flux,ltx --rounds 25 --json "$out/graph-op-ab.json"
  step branch-op-ab 200 python benchmarks/experimental/branch_op_ab.py --shapes cogvideox,wan1.3b,h3 --rounds 10 --json "$out/branch-op-ab.json"
  step call-anatomy 150 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx,cogvideox,h3 --calls 20 --json "$out/call-anatomy.json"
  ;;
esac
# at most 8 files come back: pack the folders and the logs
( cd "$out" && for d in */; do [ -d "$d" ] && tar czf "${d%/}.tgz" "$d" && rm -rf "$d"; done
  tar czf "logs-${1:-main}.tgz" ./*.log gpu.txt 2>/dev/null && rm -f ./*.log )
cat "$out/summary.txt"
