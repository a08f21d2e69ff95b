#!/usr/bin/env bash
# Batched work on a GPU host (device time is scarce). Everything lands under $OUT (or ./gpu-out).
# Usage (repo root, after `source install-bundle.sh .gpu-bundle` on a host without a package index):
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh main    # default `ditprof compare` (h3, fp8) + validate 50 blocks
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh extra   # attention benchmark, kernel accuracy, --sp 1, 16 GiB, GPU tests
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh diag    # sm90 kernel: option sweep + ncu (stall reasons per SASS line)
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh probe   # can MUFU.EX2 / FFMA and wgmma overlap? (WITH_TESTS=1: + sm90 tests)
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh final     # sm90 GPU tests + attention side by side (h3)
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh compare   # default `ditprof compare` (h3) only
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh sweep     # sm90 option sweep only (SWEEP_VARIANTS), then TIMELINE_OPTS
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh timeline  # sm90 kernel: in-kernel clock trace (TIMELINE_OPTS="default k=v,k=v")
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh graphs    # CUDA-graph replay timing: GPU tests + compare h3/ltx/flux/cogvideox
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh host      # host overhead per fp8 call (TVM-FFI vs JIT launch) + small compares
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh sp        # --sp P (default 2) on a multi-GPU kind: h3 at P and at 1
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh sp-families  # --sp P for the other families' presets
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh issue6  # accuracy table with the fp8 row, 16 GiB feasibility, sm90 tests
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh families # real MiniMax-H3 default compare, accuracy table, feasibility, GPU tests
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh families2 # h3 at 768x1344x124, validate 50 h3 blocks, Wan 2.2 feasibility
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh qwen      # Qwen-Image: compare, accuracy table, feasibility
#   PYTHONPATH=$PWD bash benchmarks/gpu_host_run.sh families3 # FLUX.2 (both stacks), LTX-2, HunyuanVideo-1.5
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
knob_winner_tests() {  # knob_winner_tests JSON GPU_TESTS_TIMEOUT: the best prep setting of an interleaved knob run (>= 1 % on the geometric mean), then the INT8 prep's and every sm90 GPU test with it as the process default
  best=$(python benchmarks/experimental/prep_best_setting.py "$1" --min-gain 0.01)
  echo "best setting: ${best:-none}" | tee -a "$out/summary.txt"
  [ -n "$best" ] || return 0
  export DITPROF_PREP_KNOBS="$best"
  step prep-int8-gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  step gpu-tests "$2" python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
case "${1:-main}" in
families)  # session 6: the real MiniMax-H3 block as the default, every family re-measured
  step compare-h3 250 python -m ditprof compare --out "$out/compare-h3"
  step accuracy-table 260 python -m ditprof accuracy-table --device cuda --out "$out/accuracy-table"
  step feasibility 200 python benchmarks/feasibility.py --device cuda --json "$out/feasibility.json"
  step gpu-tests 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_validate.py tests/test_cuda_graph.py
  ;;
families2)  # session 6, second batch: h3 at the pipeline's own request size, 50 real blocks, the Wan 2.2 presets
  step compare-h3-768x1344x124 200 python -m ditprof compare --height 768 --width 1344 --frames 124 --out "$out/compare-h3-768"
  step validate-h3 260 python -m ditprof validate --preset h3 --blocks 50 --device cuda --steps 50 --out "$out/validate-h3"
  step feasibility-wan22 90 python benchmarks/feasibility.py --device cuda --presets wan2.2-t2v-a14b,wan2.2-ti2v-5b --json "$out/feasibility-wan22.json"
  ;;
qwen)  # session 6, third batch: the Qwen-Image family
  step compare-qwen-image 150 python -m ditprof compare --preset qwen-image --out "$out/compare-qwen-image"
  step accuracy-qwen-image 150 python -m ditprof accuracy-table --device cuda --presets qwen-image --out "$out/accuracy-qwen-image"
  step feasibility-qwen-image 90 python benchmarks/feasibility.py --device cuda --presets qwen-image --json "$out/feasibility-qwen-image.json"
  ;;
families3)  # session 7: FLUX.2, LTX-2, HunyuanVideo-1.5 (inputs captured from the model's own forward)
  step compare-flux2-double 200 python -m ditprof compare --preset flux.2-dev --out "$out/compare-flux2-double"
  step compare-flux2-single 150 python -m ditprof compare --preset flux.2-dev --kind single --out "$out/compare-flux2-single"
  step compare-ltx2 150 python -m ditprof compare --preset ltx-2 --out "$out/compare-ltx2"
  step compare-hv15 200 python -m ditprof compare --preset hunyuan-video-1.5 --out "$out/compare-hv15"
  step accuracy-new 200 python -m ditprof accuracy-table --device cuda --presets flux.2-dev,ltx-2 --out "$out/accuracy-new"
  step feasibility-new 150 python benchmarks/feasibility.py --device cuda --presets flux.2-dev,ltx-2,hunyuan-video-1.5 --json "$out/feasibility-new.json"
  ;;
reliability)  # session 7: the plan, noise verdicts and NaN checks on the GPU
  step compare-h3-plan 250 python -m ditprof compare --out "$out/compare-h3-plan"
  step compare-flux-plan 150 python -m ditprof compare --preset flux.1-dev --out "$out/compare-flux-plan"
  step refuse-16g 60 python -m ditprof profile --preset hunyuan-video --kind single --gpu-memory 8GiB --out "$out/refuse-16g"
  step gpu-tests 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_finite_checks.py tests/test_cuda_graph.py tests/test_validate.py
  ;;
hta)  # session 7: record a small GPU trace for the CI HTA test, run the GPU HTA test
  step record 120 python -m ditprof compare --preset h3-mini --tokens 1024 --device cuda --iters 3 --warmup 1 --no-cuda-graph --out "$out/rec"
  mkdir -p "$out/hta-data/h3-mini-h200-baseline" "$out/hta-data/h3-mini-h200-swapped"
  for r in baseline swapped; do gzip -c "$out"/rec/tb/$r/*.pt.trace.json > "$out/hta-data/h3-mini-h200-$r/$r.h200.pt.trace.json.gz"; done
  step hta-gpu-test 200 python -m pytest -q -p no:cacheprovider tests/test_hta.py tests/test_diff.py
  ;;
op)  # session 7: the custom op on the GPU (key masks vs float64, inductor), compile time, HunyuanVideo-1.5 with fp8
  step op-gpu-tests 250 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_op_gpu.py tests/test_fp8_kernel_gpu.py benchmarks/experimental/test_fp8_sm90_variants_gpu.py
  step compile-time 300 python benchmarks/compile_time.py --json "$out/compile-time.json"
  step compare-hv15-fp8 250 python -m ditprof compare --preset hunyuan-video-1.5 --out "$out/compare-hv15-fp8"
  ;;
op2)  # session 7: HunyuanVideo-1.5 in the accuracy table (key masks), host cost per call with the op
  step accuracy-hv15 200 python -m ditprof accuracy-table --device cuda --presets hunyuan-video-1.5 --out "$out/accuracy-hv15"
  step host-overhead 150 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  ;;
launch)  # session 8: the launch record (host cost), key lengths in both kernels, finiteness without a sync
  step launch-gpu-tests 330 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_fp8_key_lens_gpu.py tests/test_finite_checks.py tests/test_fp8_op_gpu.py tests/test_cuda_graph.py
  step host-overhead 120 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step kernel-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_kernel_gpu.py tests/test_prep.py -k "not slow"
  ;;
session8)  # session 8, second batch: host cost after the fixes, the GPU tests, peers at the issue's shapes, flux
  step host-overhead 90 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step gpu-tests 220 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_fp8_key_lens_gpu.py tests/test_finite_checks.py tests/test_fp8_op_gpu.py tests/test_fp8_kernel_gpu.py -k "not compiles_with_inductor"
  step attention-peers 170 python benchmarks/attention.py --shapes ${PEER_SHAPES:-flux,ltx,h3} --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step compare-flux 110 python -m ditprof compare --preset flux.1-dev --iters 5 --out "$out/compare-flux"
  ;;
session8b)  # session 8, third batch: host cost with the sticky flags, the sm90 GPU tests, peers, flux
  step host-overhead 90 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step gpu-tests 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_finite_checks.py tests/test_fp8_op_gpu.py tests/test_fp8_key_lens_gpu.py -k "not sm120 and not compiles_with_inductor"
  step attention-peers 150 python benchmarks/attention.py --shapes ${PEER_SHAPES:-flux,ltx,h3} --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step compare-flux 110 python -m ditprof compare --preset flux.1-dev --iters 5 --out "$out/compare-flux"
  ;;
session8c)  # session 8, fourth batch: two prep launches, inference-mode records; tests, host cost, flux, h3
  step gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_finite_checks.py tests/test_fp8_op_gpu.py tests/test_fp8_key_lens_gpu.py tests/test_prep.py tests/test_cuda_graph.py -k "not sm120 and not compiles_with_inductor"
  step host-overhead 80 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step compare-flux 110 python -m ditprof compare --preset flux.1-dev --iters 5 --out "$out/compare-flux"
  step compare-h3 150 python -m ditprof compare --iters 5 --out "$out/compare-h3"
  ;;
session9a)  # session 9, first batch: every sm90-path GPU test after session 8's last changes, the flux eager diagnosis
  step gpu-tests 400 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level"
  step eager-diag 120 python benchmarks/experimental/eager_host_diag.py --preset flux.1-dev --rounds 3 --iters 10 --json "$out/eager-diag.json"
  ;;
session9b)  # session 9, second batch: the sm120 kernel emulated on Hopper (prep key lengths), host cost, flux compare
  step sm120-gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests -k "sm120 or two_level"
  step host-overhead 80 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step compare-flux 110 python -m ditprof compare --preset flux.1-dev --iters 5 --out "$out/compare-flux"
  ;;
session9c)  # session 9, third batch: INT8 Q/K (issue 18) -- GPU tests, cost at h3/flux/ltx, block-level accuracy
  step int8-gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_int8_qk_gpu.py tests/test_prep.py tests/test_prep_int8.py tests/test_fp8_launch_gpu.py tests/test_fp8_key_lens_gpu.py -k "${K_FILTER:-not sm120 or int8}"
  step int8-cost 240 python benchmarks/attention.py --shapes h3,flux,ltx --iters 10 --only fa3-fp8,prep-triton,prep-triton-int8,fp8-e4m3,fp8-int8 --json "$out/int8-cost.json"
  step kernels-accuracy 90 python -m ditprof kernels accuracy --device cuda --json
  ;;
session9d)  # session 9, fourth batch: block-level accuracy with QK-norm outliers in both formats, host cost, --compile
  step acc-e4m3 200 env DITPROF_FP8_QK=e4m3 python -m ditprof accuracy-table --device cuda --qk-outliers --out "$out/accuracy-qk-outliers-e4m3"
  step acc-int8 200 env DITPROF_FP8_QK=int8 python -m ditprof accuracy-table --device cuda --qk-outliers --out "$out/accuracy-qk-outliers-int8"
  step host-overhead 80 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  ;;
compile)  # issue 19: the blocks torch.compiled (fullgraph, default mode): compile time, the split with 'fused', sdpa -> fp8
  step compare-h3-compile 300 python -m ditprof compare --compile --iters 5 --out "$out/compare-h3-compile"
  step compare-flux-compile 150 python -m ditprof compare --compile --preset flux.1-dev --iters 5 --out "$out/compare-flux-compile"
  ;;
session9e)  # session 9, last batch (7 device minutes left): INT8 fp8-sm90 tests, its cost at h3, --compile on h3
  step int8-tests 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_int8_qk_gpu.py -k "sm90"
  step int8-cost 90 python benchmarks/attention.py --shapes h3 --iters 5 --only prep-triton,prep-triton-int8,fp8-e4m3,fp8-int8 --json "$out/int8-cost-h3.json"
  step compare-h3-compile 170 python -m ditprof compare --compile --iters 3 --out "$out/compare-h3-compile"
  ;;
prep-int8)  # the INT8 prep's tiling sweep at the H3 shape (issue 18's remaining cost), then the INT8 capture tests
  step prep-int8-sweep 300 python benchmarks/experimental/prep_int8_sweep.py --iters 10 --json "$out/prep-int8-sweep.json"
  step int8-capture 200 env DITPROF_FP8_QK=int8 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_cuda_graph.py tests/test_diffusers_entry.py -k "not sm120 and not compiles_with_inductor"
  ;;
session10a)  # session 10: the INT8 prep's layouts and tiling at h3 (+ prep and kernel end to end), its GPU tests
  step prep-int8-sweep 330 python benchmarks/experimental/prep_int8_sweep.py --iters 10 --end-to-end --json "$out/prep-int8-sweep.json"
  step int8-prep-tests 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  ;;
session10b)  # session 10: GPU tests left unrun by session 9 (INT8 capture, the diffusers entry), every -m gpu test
  step int8-capture 200 env DITPROF_FP8_QK=int8 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_cuda_graph.py tests/test_diffusers_entry.py -k "not sm120 and not compiles_with_inductor"
  step gpu-tests 380 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py
  ;;
session10c)  # session 10: INT8 prep + kernel end to end (h3, flux, ltx), the persistent fp8-sm90 variant's GPU test
  step int8-e2e 150 python benchmarks/experimental/prep_int8_sweep.py --setting QK_STAGES=2 --end-to-end --pairs 40 --json "$out/int8-e2e.json"
  step persistent-gpu-tests 280 python -m pytest -q -x -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_persistent_gpu.py
  ;;
session10d)  # session 10: the persistent variant's timing, the GPU tests left unrun by session 9
  step persistent-bench 200 python benchmarks/experimental/persistent_bench.py --ctas 132,264 --json "$out/persistent-bench.json"
  step int8-capture 200 env DITPROF_FP8_QK=int8 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_cuda_graph.py tests/test_diffusers_entry.py -k "not sm120 and not compiles_with_inductor"
  ;;
session10e)  # session 10: the INT8 prep's GPU tests with the new default layout (V's own launch, prefetch)
  step int8-prep-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  ;;
session10f)  # session 10: INT8 prep layouts (+ V's own stats launch), e2e per call / kernel alone with clocks and
  # power sampled beside it; the diffusers full-model GPU test (e4m3, int8); the persistent variant's GPU test
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$out/smi.csv" 2>&1 &
  smi=$!
  step int8-sweep-e2e 260 python benchmarks/experimental/prep_int8_sweep.py --no-tiling --end-to-end --rounds 40 --json "$out/int8-sweep-e2e.json"
  kill $smi 2>/dev/null
  step diffusers-gpu 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_diffusers_entry.py
  step diffusers-gpu-int8 100 env DITPROF_FP8_QK=int8 python -m pytest -q -p no:cacheprovider -m gpu tests/test_diffusers_entry.py
  step persistent-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_persistent_gpu.py
  ;;
session10g)  # session 10: INT8 vs e4m3 in steady state at h3 (clocks sampled), INT8 capture tests, host cost
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$out/smi.csv" 2>&1 &
  smi=$!
  step int8-steady 200 python benchmarks/experimental/prep_int8_sweep.py --setting QK_STAGES=2 --end-to-end --steady 2 --e2e-shapes "h3=1,30272,56,128" --json "$out/int8-steady.json"
  kill $smi 2>/dev/null
  step int8-capture 150 env DITPROF_FP8_QK=int8 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_cuda_graph.py -k "not sm120 and not compiles_with_inductor"
  step host-overhead 90 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step int8-kernel-tests 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_int8_qk_gpu.py -k "sm90"
  ;;
session11a)  # next session, first batch: every sm90-path GPU test with INT8 Q/K as the default, host cost per format
  step gpu-tests 420 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py
  step host-overhead 90 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  ;;
session11b)  # next session: INT8 vs e4m3 in steady state at the short shapes; the default compare (h3, flux) with INT8
  step int8-steady-short 200 python benchmarks/experimental/prep_int8_sweep.py --setting QK_STAGES=1 --end-to-end --steady 1 --e2e-shapes "flux=1,4608,24,128;ltx=1,7392,32,64" --json "$out/int8-steady-short.json"
  step compare-h3 200 python -m ditprof compare --iters 5 --out "$out/compare-h3"
  step compare-flux 120 python -m ditprof compare --preset flux.1-dev --iters 5 --out "$out/compare-flux"
  step persistent-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_persistent_gpu.py
  step int8-prep-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  ;;
session11d)  # next session: issue 20 lever 3 -- the linear-exp P byte variants at h3 (sweep: model, bitwise, timing), GPU tests
  step sweep-linexp 400 python benchmarks/experimental/sm90_sweep.py --out "$out/sweep-linexp" --rounds 3 --iters 6 --variants default,linexp4,linexp2,linexp1
  step linexp-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_variants_gpu.py -k linexp
  ;;
session12a)  # next session: the split-KV tail of fp8-sm90 (issue 17 short shapes, issue 20): GPU tests, then shipped vs split + merge
  step splitkv-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_splitkv_gpu.py
  step splitkv-bench 240 python benchmarks/experimental/splitkv_bench.py --rounds 15 --json "$out/splitkv-bench.json"
  ;;
session12b)  # issue 20 lever 1: the experimental single-pass INT8 prep -- GPU tests (h3/flux/ltx vs the torch reference, knobs), then timed against the shipped preps
  step single-pass-gpu-tests 420 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_prep_single_pass.py
  step single-pass-bench 240 python benchmarks/experimental/prep_single_pass_bench.py --json "$out/prep-single-pass.json"
  ;;
session12c)  # issue 20 lever 1, kernel side: fp8-sm90 INT8 with per-160-key-tile K and V descales -- GPU tests (vs float64, its model, the shipped kernel), then shipped vs variant timing
  step tile-scales-gpu-tests 300 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_tile_scales_gpu.py
  step tile-scales-bench 200 python benchmarks/experimental/tile_scales_bench.py --rounds 15 --json "$out/tile-scales-bench.json"
  ;;
session12d)  # issue 20 lever 1 end to end: the single-pass prep through the tile-scales kernel vs the shipped call
  step single-pass-e2e-tests 300 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_single_pass_e2e.py
  step single-pass-e2e 300 python benchmarks/experimental/single_pass_e2e.py --rounds 20 --json "$out/single-pass-e2e.json"
  ;;
session12e)  # issue 17 flux gap: per-CTA %globaltimer timeline (fixed cost vs partial last round vs loop rate), SM clock / power beside it
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv -lms 50 > "$out/smi.csv" 2>&1 &
  smi=$!
  step ctl-flux-int8 110 python benchmarks/experimental/cta_timeline.py --shape 1,24,4608,128 --format int8 --check --json "$out/ctl-flux-int8.json" --plot "$out/ctl-flux-int8.png"
  step ctl-flux-e4m3 110 python benchmarks/experimental/cta_timeline.py --shape 1,24,4608,128 --format e4m3 --check --json "$out/ctl-flux-e4m3.json" --plot "$out/ctl-flux-e4m3.png"
  step ctl-flux-pers 110 python benchmarks/experimental/cta_timeline.py --shape 1,24,4608,128 --format e4m3 --persistent --check --json "$out/ctl-flux-pers.json" --plot "$out/ctl-flux-pers.png"
  step ctl-h3-int8 110 python benchmarks/experimental/cta_timeline.py --shape 1,56,30272,128 --format int8 --runs 5 --json "$out/ctl-h3-int8.json" --plot "$out/ctl-h3-int8.png"
  step ctl-h3-pers 110 python benchmarks/experimental/cta_timeline.py --shape 1,56,30272,128 --format e4m3 --persistent --runs 5 --json "$out/ctl-h3-pers.json" --plot "$out/ctl-h3-pers.png"
  kill "$smi"
  ;;
session20a)  # session 20, first call (its --qrot streamk option is gone with the build: commit d648966): the stream-K Q-in-the-kernel experiment's GPU tests and op A/B (session19c), then the INT8 prep's GPU tests (half of session19d)
  step streamk-qrot-tests 200 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_prep_int8.py -k "streamk_q_in or q_bh_from or q_in_the_kernel"
  step streamk-qrot-ab 240 python benchmarks/experimental/qrot_op_ab.py --qrot streamk --shapes flux,ltx,wan1.3b --rounds 25 --json "$out/streamk-qrot-ab.json"
  step prep-int8-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  ;;
session20b)  # session 20, second call: every sm90 GPU test (the other half of session19d; DITPROF_FP8_QROT from the caller), then the stats launch's V knobs timed interleaved (session19b without the winner's tests)
  step gpu-tests 350 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128;wan13b=1,32760,12,128;wan14b=1,75600,40,128;hunyuan=1,119056,24,128"
  step prep-vstats 230 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 20 \
    --settings "vm2=STATS_V_MULT=2;vm4=STATS_V_MULT=4;vfirst=STATS_V_FIRST=True;vm4first=STATS_V_MULT=4,STATS_V_FIRST=True" --json "$out/prep-vstats.json"
  ;;
session20c)  # session 20, with part3 (FA3): issue 17's table at seven shapes with Q in the kernel (one process), then the stats launch's V knobs timed interleaved
  step attention-peers 400 python benchmarks/attention.py --shapes flux,ltx,cogvideox,wan1.3b,h3,wan14b,hunyuan --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128;wan13b=1,32760,12,128;wan14b=1,75600,40,128;hunyuan=1,119056,24,128"
  step prep-vstats 170 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 15 \
    --settings "vm2=STATS_V_MULT=2;vm4=STATS_V_MULT=4;vfirst=STATS_V_FIRST=True;vm4first=STATS_V_MULT=4,STATS_V_FIRST=True" --json "$out/prep-vstats.json"
  ;;
session23v)  # session 23: V's descale from sampled rows (prep_triton.V_SAMPLE; measured, rejected, reverted: commit a8dc31b has the code): its GPU tests, then the op A/B against the shipped record
  step v-sample-gpu-tests 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py -k v_sample
  step v-sample-op-ab 110 python benchmarks/experimental/v_sample_op_ab.py --shapes flux,ltx,cogvideox,h3 --rounds 15 --rows 256 --json "$out/v-sample-op-ab.json"
  ;;
session23g)  # session 23, last: the two new graph/branch GPU tests, then the prep's direct branch vs one chain at the non-reused shapes (GPU time, one process)
  step new-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_graphs_gpu.py -k "fresh_allocations or ordered_on_any_stream"
  step branch-op-ab 200 python benchmarks/experimental/branch_op_ab.py --shapes cogvideox,wan1.3b,h3 --rounds 10 --json "$out/branch-op-ab.json"
  ;;
session23f)  # session 23, after the fix (the branch's fork/join on the default stream): what ExternalStream(0) is, fresh inputs with the branch, the graph/branch GPU tests, the h3 compare
  step external-stream-0 30 python -c "import torch; s = torch.cuda.ExternalStream(0); print('ExternalStream(0).cuda_stream =', hex(s.cuda_stream), '; default stream =', hex(torch.cuda.default_stream().cuda_stream))"
  step repro-branch 120 python benchmarks/experimental/fresh_inputs_repro.py --shape h3 --calls 12 --json "$out/repro-branch-fixed.json"
  step graph-gpu-tests 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_graphs_gpu.py
  step compare-h3 150 python -m ditprof compare --iters 10 --out "$out/compare-h3"
  ;;
session23p)  # session 23, after the fix, with part3: issue 17/20's table at seven shapes (two processes), one call's launches
  step attention-peers 200 python benchmarks/attention.py --shapes flux,ltx,cogvideox,wan1.3b,h3 --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step attention-peers-big 200 python benchmarks/attention.py --shapes wan14b,hunyuan --iters 5 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers-big.json"
  step call-anatomy 150 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx,cogvideox,h3 --calls 20 --json "$out/call-anatomy.json"
  ;;
session23r)  # session 23: the h3 compare's NaN (q flag / NaN output with Q in the kernel): fresh inputs every call with the prep branch on and off, the compare with it off and on
  step repro-branch 120 python benchmarks/experimental/fresh_inputs_repro.py --shape h3 --calls 12 --json "$out/repro-branch.json"
  step repro-chain 120 env DITPROF_FP8_BRANCH=0 python benchmarks/experimental/fresh_inputs_repro.py --shape h3 --calls 12 --json "$out/repro-chain.json"
  step compare-h3-chain 150 env DITPROF_FP8_BRANCH=0 python -m ditprof compare --iters 10 --out "$out/compare-h3-chain"
  step compare-h3 150 python -m ditprof compare --iters 10 --out "$out/compare-h3"
  step compare-h3-chain2 150 env DITPROF_FP8_BRANCH=0 python -m ditprof compare --iters 10 --out "$out/compare-h3-chain2"
  ;;
session23t)  # session 23: the launch / graph / stream-K / op GPU tests after the side-stream refactor (d26e59d), the host cost per call
  step launch-gpu-tests 330 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_graphs_gpu.py tests/test_fp8_launch_gpu.py tests/test_fp8_sm90_streamk_gpu.py tests/test_cuda_graph.py tests/test_fp8_op_gpu.py tests/test_finite_checks.py
  step host-overhead 100 python benchmarks/host_overhead.py --json "$out/host_overhead.json"
  ;;
session24a)  # session 24, with part2 (ran with a first ROT_TAIL knob covering the stats and the K quantize loops; the parse of its setting failed there, the A/B ran by hand: NOTES "Session 24"; now the knob is STATS_ROT_TAIL, on by default): the rotating K loops without per-element row masks vs the masked loops, the prep alone timed interleaved at seven shapes; the INT8 prep's GPU tests (its layouts included); the wgmma-preset and launch GPU tests (not run since session 23's review commits)
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128;wan13b=1,32760,12,128;wan14b=1,75600,40,128;hunyuan=1,119056,24,128"
  step prep-rottail 240 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "masked=STATS_ROT_TAIL=False" --json "$out/prep-rottail.json"
  best=$(python benchmarks/experimental/prep_best_setting.py "$out/prep-rottail.json" --min-gain 0.01)
  echo "best setting: ${best:-none}" | tee -a "$out/summary.txt"
  step prep-int8-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  step preset-launch-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_sm90_preset_gpu.py tests/test_fp8_launch_gpu.py tests/test_fp8_launch_graphs_gpu.py
  ;;
session24b)  # session 24: every sm90 GPU test (DITPROF_PREP_KNOBS from the caller: session24a's winner, if any), then one call's launches at flux and h3
  step gpu-tests 400 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step call-anatomy 120 python benchmarks/experimental/call_anatomy.py --shapes flux,h3 --calls 20 --json "$out/call-anatomy.json"
  ;;
session23a)  # next H200 lease, with part3 (FA3): issues 17/20's table at five shapes (one process, graph-replayed op), one call's launches at four shapes (the host cost is in session23t)
  step attention-peers 330 python benchmarks/attention.py --shapes flux,ltx,cogvideox,wan1.3b,h3 --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step call-anatomy 150 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx,cogvideox,h3 --calls 20 --json "$out/call-anatomy.json"
  ;;
session23b)  # next H200 lease, with part3: the two long shapes of the table (one process), the default h3 compare
  step attention-peers-big 330 python benchmarks/attention.py --shapes wan14b,hunyuan --iters 5 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers-big.json"
  step compare-h3 220 python -m ditprof compare --iters 10 --out "$out/compare-h3"
  ;;
session22f)  # session 22, after captured calls branch the prep: the launch / graph / stream-K / op GPU tests, then the op with graph replay vs direct launches (GPU time, one process)
  step launch-gpu-tests 330 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_graphs_gpu.py tests/test_fp8_launch_gpu.py tests/test_fp8_sm90_streamk_gpu.py tests/test_cuda_graph.py tests/test_fp8_op_gpu.py tests/test_finite_checks.py
  step graph-op-ab 200 python benchmarks/experimental/graph_op_ab.py --shapes flux,ltx --rounds 25 --json "$out/graph-op-ab.json"
  ;;
session22e)  # session 22: the INT8 prep as one CUDA graph with concurrent branches (Q's quantize beside the stats, V's beside K's) vs the shipped chain, bits compared
  step prep-branches 300 python benchmarks/experimental/prep_branches_bench.py --shapes flux,ltx,wan1.3b,cogvideox,h3 --rounds 30 --json "$out/prep-branches.json"
  ;;
session22d)  # session 22, after the test fixes: the graph GPU tests again, the flux compare with every launch made directly (DITPROF_FP8_GRAPHS=0) and with graph replay, the ltx-video compare
  step graph-gpu-tests 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_graphs_gpu.py
  step compare-flux-direct 200 env DITPROF_FP8_GRAPHS=0 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux-direct"
  step compare-flux 200 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  step compare-ltx 200 python -m ditprof compare --preset ltx-video --iters 10 --out "$out/compare-ltx"
  ;;
session22a)  # session 22: repeated calls replayed as one CUDA graph (kernels/launch_graphs.py) -- its GPU tests and the launch / finite-check / graph tests, the host cost per call (graphs on and off), the flux compare
  step graph-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_graphs_gpu.py tests/test_fp8_launch_gpu.py tests/test_finite_checks.py tests/test_cuda_graph.py
  step host-overhead 150 python benchmarks/host_overhead.py --json "$out/host_overhead.json"
  step compare-flux 200 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  ;;
session22b)  # session 22: every sm90 GPU test with graph replay on by default
  step gpu-tests 400 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  ;;
session22c)  # session 22, with part3 (FA3): issue 17/20's table at four shapes (one process), one h3 call's launches, the default h3 compare
  step attention-peers 260 python benchmarks/attention.py --shapes flux,ltx,cogvideox,h3 --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step call-anatomy 100 python benchmarks/experimental/call_anatomy.py --shapes h3 --calls 10 --json "$out/call-anatomy.json"
  step compare-h3 200 python -m ditprof compare --iters 10 --out "$out/compare-h3"
  ;;
session21a)  # session 21: the INT8 accumulator preset as one wgmma (then experimental; commit 0555b36) -- its GPU tests (bits equal to the shipped kernel), then the op A/B at the plain-grid shapes
  step preset-gpu-tests 330 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_mma_preset_gpu.py
  step preset-bench 230 python benchmarks/experimental/mma_preset_bench.py --shapes cogvideox,h3,wan14b,hunyuan --rounds 15 --json "$out/mma-preset-bench.json"
  ;;
session21b)  # session 21, the wgmma preset shipped at head_dim 128: its GPU tests (bits equal to the LDS build, both grids), then the A/B at the stream-K shapes and h3
  step preset-gpu-tests 200 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_sm90_preset_gpu.py
  step preset-bench 250 python benchmarks/experimental/mma_preset_bench.py --shapes flux,wan1.3b,h3 --rounds 25 --json "$out/mma-preset-bench.json"
  ;;
session20e)  # session 20, after call_anatomy's call split was fixed: one call's launches at CogVideoX and h3
  step call-anatomy 100 python benchmarks/experimental/call_anatomy.py --shapes cogvideox,h3 --calls 10 --json "$out/call-anatomy.json"
  ;;
session20d)  # session 20, last: after the revert (the stream-K grid's prep Q again) and with STATS_V_MULT=2 -- the launch records' and the stream-K grid's GPU tests, then one call's launches at four shapes (call_anatomy; FA3's line only with part3)
  step launch-gpu-tests 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_fp8_sm90_streamk_gpu.py
  step call-anatomy 150 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx,cogvideox,h3 --calls 20 --json "$out/call-anatomy.json"
  ;;
session19c)  # session 20 ran it as session20a (rejected, reverted since: commit d648966 has the build): Q in the kernel on the stream-K grid's whole-tile CTAs (DITPROF_FP8_QROT=streamk, an experiment) -- its GPU tests and the prep's q_bh_from, then the op A/B against the stream-K grid with the prep's Q at the stream-K shapes
  step streamk-qrot-tests 200 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_launch_gpu.py tests/test_prep_int8.py -k "streamk_q_in or q_bh_from or q_in_the_kernel"
  step streamk-qrot-ab 240 python benchmarks/experimental/qrot_op_ab.py --qrot streamk --shapes flux,ltx,wan1.3b --rounds 25 --json "$out/streamk-qrot-ab.json"
  ;;
session19d)  # session 20 ran it as session20a / session20b, before the revert: every sm90 GPU test and the INT8 prep's with this session's launch / prep changes (the stream-K q_rot plumbing, the quantize launch's Q_BH0)
  step gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step prep-int8-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  ;;
session19b)  # session 20 ran it as session20c (STATS_V_MULT=2 shipped): the stats launch's V amax programs longer (STATS_V_MULT) and/or first in the grid (STATS_V_FIRST), timed interleaved at seven shapes; a winner (>= 1 % on the geometric mean) runs the INT8 prep's GPU tests and every sm90 GPU test as the process default
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128;wan13b=1,32760,12,128;wan14b=1,75600,40,128;hunyuan=1,119056,24,128"
  step prep-vstats 240 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "vm2=STATS_V_MULT=2;vm4=STATS_V_MULT=4;vfirst=STATS_V_FIRST=True;vm4first=STATS_V_MULT=4,STATS_V_FIRST=True" --json "$out/prep-vstats.json"
  knob_winner_tests "$out/prep-vstats.json" 300
  ;;
session19a)  # (session 20 ran its peers and h3 compare as session20c and by hand) with part3 (FA3): one call's launches at four shapes (call_anatomy's reference now the trace's typical call; q_rot at CogVideoX / h3), peers at seven shapes with Q in the kernel, the default h3 compare and the flux compare
  step call-anatomy 120 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx,cogvideox,h3 --calls 20 --json "$out/call-anatomy.json"
  step attention-peers 420 python benchmarks/attention.py --shapes flux,ltx,cogvideox,wan1.3b,h3,wan14b,hunyuan --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step compare-h3 200 python -m ditprof compare --iters 10 --out "$out/compare-h3"
  ;;
session18g)  # session 18, last: the q_rot GPU tests moved to tests/ (the shipped build through launch_compiled, both launch paths), the bench on the shipped build at flux / h3
  step qrot-gpu-tests 200 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_sm90_qrot_gpu.py
  step qrot-bench 120 python benchmarks/experimental/qrot_bench.py --shapes flux,h3 --rounds 10 --json "$out/qrot-bench.json"
  ;;
session18f)  # session 18, as run (reverted since: the stream-K grid keeps the prep's Q; commit b278020 has the build): Q in the kernel on the stream-K grid too -- every sm90 GPU test, the op A/B at the stream-K shapes (flux, ltx, Wan 1.3B) and CogVideoX
  step gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step qrot-op-ab 150 python benchmarks/experimental/qrot_op_ab.py --shapes flux,ltx,wan1.3b,cogvideox --rounds 25 --json "$out/qrot-op-ab.json"
  ;;
session18e)  # session 18: Q in the kernel shipped (fp8-sm90 INT8, plain grid) -- every sm90 GPU test, the op A/B (Q in the kernel vs the prep's Q, one process), the INT8 prep's GPU tests
  step gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step qrot-op-ab 150 python benchmarks/experimental/qrot_op_ab.py --shapes flux,cogvideox,wan1.3b,h3,wan14b --rounds 15 --json "$out/qrot-op-ab.json"
  step prep-int8-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  ;;
session18c)  # session 18, third round: the qrot variant with 32-bit Q loads (byte code stores again) -- GPU tests, then the bench
  step qrot-gpu-tests 240 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_qrot_gpu.py
  step qrot-bench 240 python benchmarks/experimental/qrot_bench.py --shapes flux,ltx,cogvideox,h3 --rounds 15 --json "$out/qrot-bench.json"
  ;;
session18d)  # session 18, with part3 (FA3): issue 17's table at all seven shapes, one process, with today's code
  step attention-peers 420 python benchmarks/attention.py --shapes flux,ltx,cogvideox,wan1.3b,h3,wan14b,hunyuan --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  ;;
session18b)  # session 18, second round: the qrot variant with 32-bit Q loads and 16-bit code stores -- GPU tests, then the bench
  step qrot-gpu-tests 240 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_qrot_gpu.py
  step qrot-bench 240 python benchmarks/experimental/qrot_bench.py --shapes flux,ltx,cogvideox,h3 --rounds 15 --json "$out/qrot-bench.json"
  ;;
session18a)  # session 18: Q rotated and quantized in the kernel (fp8_fwd_sm90_qrot.py) -- its GPU tests, then prep without Q + the variant vs the shipped prep + kernel (plain grid both), call anatomy at h3 / CogVideoX
  step qrot-gpu-tests 240 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_qrot_gpu.py
  step qrot-bench 240 python benchmarks/experimental/qrot_bench.py --shapes flux,ltx,cogvideox,h3 --rounds 15 --json "$out/qrot-bench.json"
  step call-anatomy 90 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx,cogvideox,h3 --calls 20 --json "$out/call-anatomy.json"
  ;;
session17a)  # session 17: V by its reciprocal (the only path now, the torch chain too) and the rotated-K-stats rows rule (16 at head_dim 128 with >= 24 stats programs per SM) timed against 32 / 16 forced at seven shapes; the e4m3 and INT8 prep GPU tests and every sm90 GPU test with the new defaults
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128;wan13b=1,32760,12,128;wan14b=1,75600,40,128;hunyuan=1,119056,24,128"
  step prep-rot 200 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "rot32=STATS_ROT_ROWS=32;rot16=STATS_ROT_ROWS=16" --json "$out/prep-rot.json"
  step prep-int8-gpu-tests 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  step gpu-tests 260 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  ;;
session17b)  # session 17, with part3 (FA3): peers at flux / ltx / h3, one call's launches, the flux compare, with session 17's prep
  step attention-peers 150 python benchmarks/attention.py --shapes flux,ltx,h3 --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step call-anatomy 60 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx --calls 30 --json "$out/call-anatomy.json"
  step compare-flux 100 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  ;;
session17d)  # session 17, the last minutes: with V cheaper (reciprocal codes), does V's quantize pay for a launch of its own still? SPLIT_V=False timed interleaved
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128"
  step prep-splitv 120 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "nosplit=SPLIT_V=False;nosplit_noprefetch=SPLIT_V=False,QK_PREFETCH=False" --json "$out/prep-splitv.json"
  ;;
session17c)  # session 17, last lease: is the flux compare's eager 0.82x (host overhead 1.53 ms vs 0.38 earlier) the host or session 17's prep? the op's host cost per call, the flux block interleaved sdpa / fp8, the compare again
  step host-overhead 60 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step eager-diag-flux 150 python benchmarks/experimental/eager_host_diag.py --preset flux.1-dev --rounds 3 --iters 10 --json "$out/eager-diag-flux.json"
  step compare-flux 100 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  ;;
session16a)  # session 17, as run (V_RECIP is gone since: V by its reciprocal is the only path; it would now fail as an unknown knob): V's codes by reciprocal (V_RECIP) and 16-row rotated K stats tiles (122 registers vs 216 at D 128) timed; the winner runs the INT8 prep GPU tests and every sm90 GPU test as the process default, then peers, the flux compare and one call's launches with it
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128"
  step prep-knobs 200 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "vrecip=V_RECIP=True;srot16=STATS_ROT_ROWS=16;vrecip_srot16=V_RECIP=True,STATS_ROT_ROWS=16" --json "$out/prep-knobs.json"
  knob_winner_tests "$out/prep-knobs.json" 260
  step call-anatomy 60 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx --calls 30 --json "$out/call-anatomy.json"
  ;;
session16b)  # session 17, as run, with part3 (FA3): peers at flux / ltx / h3 and the flux compare with both session-15 prep changes (+ DITPROF_PREP_KNOBS if session16a found a winner: pass it in the environment)
  step attention-peers 150 python benchmarks/attention.py --shapes flux,ltx,h3 --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn --json "$out/attention-peers.json"
  step compare-flux 100 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  step host-overhead 60 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  ;;
session15c)  # session 15 (as run; the STATS_ELEM knob is gone since: its fp32 fold, "2", is the only path now): the stats pass's rotated K folded elementwise vs per-tile reductions; the best setting (if >= 2 % faster on the geometric mean) then runs the INT8 prep GPU tests and every sm90 GPU test as the process default
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128"
  step prep-elem 200 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "elem1=STATS_ELEM=1;elem2=STATS_ELEM=2;w8=STATS_WARPS=8;elem1w8=STATS_ELEM=1,STATS_WARPS=8;elem2w8=STATS_ELEM=2,STATS_WARPS=8" --json "$out/prep-elem.json"
  best=$(python benchmarks/experimental/prep_best_setting.py "$out/prep-elem.json" --min-gain 0.02)
  echo "best setting: ${best:-none}" | tee -a "$out/summary.txt"
  if [ -n "$best" ]; then
    export DITPROF_PREP_KNOBS="$best"
    step prep-int8-gpu-tests 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
    step gpu-tests 260 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
    step call-anatomy 60 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx --calls 30 --json "$out/call-anatomy.json"
  fi
  ;;
session15a)  # session 15, first half: INT8 codes by reciprocal (QK_RECIP, now the default) vs the exact quotient, with the pipelined-load and tiling knobs; the INT8 prep's GPU tests; one call's launches
  shapes="flux=1,4608,24,128;ltx=1,7392,32,64;cogvideox=1,17776,48,64;h3=1,30272,56,128"
  step prep-recip 200 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "exact=QK_RECIP=False;rows256=QK_ROWS=256;srot64=STATS_ROT_ROWS=64" --json "$out/prep-recip.json"
  step prep-stages 150 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "$shapes" --rounds 30 \
    --settings "exact=QK_RECIP=False;st3=QK_STAGES=3,QK_PREFETCH=False;exact_st3=QK_RECIP=False,QK_STAGES=3,QK_PREFETCH=False;st2=QK_STAGES=2,QK_PREFETCH=False" --json "$out/prep-stages.json"
  step prep-int8-gpu-tests 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_prep_int8.py
  step call-anatomy 60 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx --calls 30 --json "$out/call-anatomy.json"
  ;;
session15b)  # session 15, second half: every sm90 GPU test with QK_RECIP, peers at flux / ltx / h3 (same process), the flux compare
  step gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step attention-peers 150 python benchmarks/attention.py --shapes flux,ltx,h3 --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn,prep-triton --json "$out/attention-peers.json"
  step compare-flux 100 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  ;;
session14b)  # session 14: every sm90 GPU test (the jsonschema import fixed), lever 4 with l from the tensor cores (accuracy, h3 timing)
  step gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level and not streamk" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step v-center-gpu 150 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_v_center_gpu.py
  step sweep-acc-o 280 python benchmarks/experimental/sm90_sweep.py --variants default,acc-o-n128,n128-split4,wg2-acc-o --rounds 3 --out "$out/sweep-acc-o"
  ;;
session14a)  # session 14, first batch: the launch refactor (f886614) on the GPU -- stream-K tests, every sm90 GPU test; lever 4's accuracy check; the flux compare (fp8_launches in the report)
  step streamk-gpu-tests 200 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_sm90_streamk_gpu.py
  step gpu-tests 260 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level and not streamk" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step v-center-gpu 150 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_v_center_gpu.py
  step compare-flux 100 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  ;;
session13c)  # session 13: fp8-sm90 on the stream-K grid (shipped) -- its GPU tests, every sm90 GPU test with it
  step streamk-gpu-tests 240 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_sm90_streamk_gpu.py
  step gpu-tests 300 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level and not streamk" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  ;;
session13d)  # session 13: with the stream-K grid -- kernel-only bench, peers at flux/ltx, call anatomy, the flux compare, host cost
  step streamk-bench 120 python benchmarks/experimental/streamk_bench.py --shapes flux,ltx --rounds 15 --json "$out/streamk-bench.json"
  step attention-peers 150 python benchmarks/attention.py --shapes flux,ltx --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn,prep-triton --json "$out/attention-peers.json"
  step call-anatomy 60 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx --calls 30 --json "$out/call-anatomy.json"
  step compare-flux 120 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  step host-overhead-flux 60 python benchmarks/host_overhead.py --shape 1,4608,24,128 --json "$out/host-overhead-flux.json"
  ;;
prep-ncu)  # session 13: ncu of the prep's launches at flux (INT8: stats, Q/K quantize, V quantize), why ~1-1.6 TB/s
  step ncu-prep-flux 200 ncu --clock-control none --set full --import-source no -k "regex:_stats_kernel|_quant_kernel" \
    --launch-skip 3 --launch-count 3 -f -o "$out/ncu-prep-flux" python benchmarks/experimental/prep_ncu_child.py --shape 1,4608,24,128 --format int8
  ncu -i "$out/ncu-prep-flux.ncu-rep" --page details --csv > "$out/ncu-prep-flux-details.csv" 2>&1
  ncu -i "$out/ncu-prep-flux.ncu-rep" --page details > "$out/ncu-prep-flux-details.txt" 2>&1
  rm -f "$out/ncu-prep-flux.ncu-rep"
  ;;
session13e)  # session 13: stream-K GPU tests (+ JIT launch, fp16), host cost at the tiny shape, the INT8 prep's knobs at flux / ltx (ncu: occupancy-bound)
  step streamk-gpu-tests 200 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_fp8_sm90_streamk_gpu.py
  step host-overhead 60 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  step prep-knobs 200 python benchmarks/experimental/prep_tiling_interleaved.py --shapes "flux=1,4608,24,128;ltx=1,7392,32,64" --rounds 30 \
    --settings "qkb32=QK_BLOCK=32;rows256=QK_ROWS=256;rows256qkb32=QK_ROWS=256,QK_BLOCK=32;qw8=QUANT_WARPS=8;sw8=STATS_WARPS=8;chunk128=STATS_CHUNK=128" --json "$out/prep-knobs.json"
  ;;
prep-fwht)  # session 13: the INT8 prep's Q/K launch with an in-register Walsh-Hadamard transform (no matrix, no dot) vs the shipped
  step fwht-bench 100 python benchmarks/experimental/prep_fwht_bench.py --shapes ${FWHT_SHAPES:-flux,ltx,h3} --rounds 20 --json "$out/prep-fwht-bench.json"
  step fwht-gpu-tests 60 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_prep_fwht.py ${FWHT_TESTS:+-k "$FWHT_TESTS"}
  ;;
v-center)  # issue 20 lever 4 on the GPU: biased V over 32768 keys, O in the wgmma accumulator (no promotion), V centred or not
  step v-center-gpu 200 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_v_center_gpu.py
  ;;
session13)  # session 13, first batch: every sm90 GPU test with 192-key tiles at head_dim 64 (+ the launch refactors), then the stream-K tail
  step gpu-tests 230 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step streamk-gpu-tests 150 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_streamk_gpu.py
  step streamk-bench 200 python benchmarks/experimental/streamk_bench.py --rounds 15 --json "$out/streamk-bench.json"
  ;;
session13a)  # next session: the stream-K tail (GPU tests, then shipped vs split-KV vs stream-K), its timeline at flux
  step streamk-gpu-tests 200 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_streamk_gpu.py
  step streamk-bench 250 python benchmarks/experimental/streamk_bench.py --rounds 15 --json "$out/streamk-bench.json"
  ;;
session13b)  # next session: the kernel as a programmatic dependent launch after the prep (GPU tests, then the real call back to back)
  step pdl-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_pdl_gpu.py
  step pdl-bench 200 python benchmarks/experimental/pdl_bench.py --rounds 15 --json "$out/pdl-bench.json"
  step call-anatomy 150 python benchmarks/experimental/call_anatomy.py --shapes flux,ltx --calls 30 --json "$out/call-anatomy.json"
  ;;
session12i)  # session 12, last: head_dim 64 with 192-key tiles (issue 20), the flux timeline with the 16-byte stores, split-KV with them
  step tile-n-bench 110 python benchmarks/experimental/tile_n_bench.py --rounds 15 --json "$out/tile-n-bench.json"
  step ctl-flux-int8 40 python benchmarks/experimental/cta_timeline.py --shape 1,24,4608,128 --format int8 --check --json "$out/ctl-flux-int8.json" --plot "$out/ctl-flux-int8.png"
  step tile192-gpu-tests 90 python -m pytest -q -s -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_tile192_gpu.py
  step splitkv-bench 50 python benchmarks/experimental/splitkv_bench.py --shapes flux,ltx --rounds 15 --json "$out/splitkv-bench.json"
  ;;
session12h)  # session 12: the shipped kernel with 16-byte O stores -- every sm90 GPU test, peers at flux/ltx, compares, store widths
  step gpu-tests 230 python -m pytest -q -p no:cacheprovider -m gpu tests -k "not sm120 and not two_level" --ignore=tests/test_report_schema.py --ignore=tests/test_prep_int8.py --ignore=tests/test_compile.py
  step attention-peers 150 python benchmarks/attention.py --shapes flux,ltx --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn,prep-triton --json "$out/attention-peers.json"
  step compare-flux 90 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  step store-bench 90 python benchmarks/experimental/store_bench.py --rounds 15 --json "$out/store-bench.json"
  step compare-h3 120 python -m ditprof compare --iters 5 --out "$out/compare-h3"
  step store-gpu-tests 100 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_store_gpu.py
  ;;
session12g)  # session 12: the wide-store epilogue (b32 / b128) -- GPU tests (bit for bit vs shipped), kernel-only timing
  step store-gpu-tests 200 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_store_gpu.py
  step store-bench 300 python benchmarks/experimental/store_bench.py --rounds 15 --json "$out/store-bench.json"
  step tile-scales-gpu-tests 120 python -m pytest -q -rf -p no:cacheprovider -m gpu benchmarks/experimental/test_fp8_sm90_tile_scales_gpu.py
  step single-pass-gpu-tests 120 python -m pytest -q -p no:cacheprovider -m gpu benchmarks/experimental/test_prep_single_pass.py -k gpu_knobs
  ;;
session12f)  # issue 17: flux eager, interleaved per block (sdpa vs fp8 INT8 default), beside compare's sequential eager
  step eager-diag-flux 150 python benchmarks/experimental/eager_host_diag.py --preset flux.1-dev --rounds 3 --iters 10 --json "$out/eager-diag-flux.json"
  step compare-flux 150 python -m ditprof compare --preset flux.1-dev --iters 10 --out "$out/compare-flux"
  ;;
session11e)  # session 11: the shipped schedule with 2 consumer warpgroups at the short shapes (issue 17: flux, ltx)
  step sweep-flux 280 python benchmarks/experimental/sm90_sweep.py --shape 1,24,4608,4608,128 --out "$out/sweep-flux" --rounds 3 --iters 10 --variants default,wg2,wg2-n128,wg2-n192,v4
  step sweep-ltx 280 python benchmarks/experimental/sm90_sweep.py --shape 1,32,7392,7392,64 --out "$out/sweep-ltx" --rounds 3 --iters 10 --variants default,wg2,wg2-n128,wg2-n192,v4
  ;;
session11c)  # next session: which existing sm90 configuration is fastest at the short shapes (issue 17: flux, ltx)
  step sweep-flux 280 python benchmarks/experimental/sm90_sweep.py --shape 1,24,4608,4608,128 --out "$out/sweep-flux" --rounds 3 --iters 10 --variants default,v4,n160-promote,n192-split
  step sweep-ltx 280 python benchmarks/experimental/sm90_sweep.py --shape 1,32,7392,7392,64 --out "$out/sweep-ltx" --rounds 3 --iters 10 --variants default,v4,n160-promote,n192-split
  ;;
session8e)  # session 8, short last batch (little device time left): the sm120 two-level kernel on the GPU only
  step sm120-gpu-tests 170 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_fp8_sm120_two_level_gpu.py tests/test_fp8_kernel_gpu.py
  ;;
session8d)  # session 8, last batch: the sm120 kernel's GPU tests (emulated on Hopper), flux eager diagnosis, host cost
  step sm120-gpu-tests 220 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_kernel_gpu.py tests/test_fp8_key_lens_gpu.py tests/test_diffusers_entry.py tests/test_fp8_sm120_two_level_gpu.py -k "sm120 or not key_lens"
  step eager-diag 100 python benchmarks/experimental/eager_host_diag.py --preset flux.1-dev --rounds 3 --iters 10 --json "$out/eager-diag.json"
  step host-overhead 80 python benchmarks/host_overhead.py --json "$out/host-overhead.json"
  ;;
peers)  # session 8: ours vs FA3 FP8/BF16 and cuDNN at the issue's shapes in one process, then the flux compare
  step attention-peers 330 python benchmarks/attention.py --shapes ${PEER_SHAPES:-flux,ltx,h3,cogvideox} --iters 10 --only fp8,fa3-fp8,fa3-fp8+quant,fa3-bf16,sdpa-cudnn,cudnn-fp8,prep-triton --json "$out/attention-peers.json"
  step compare-flux 200 python -m ditprof compare --preset flux.1-dev --out "$out/compare-flux"
  ;;
sanity)  # session 7: after the sm90 trim and the shared checks: the shipped kernel's GPU tests, one compare
  step kernel-gpu-tests 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_kernel_gpu.py tests/test_fp8_op_gpu.py -k "vs_float64 or bad or cpu or key_masks or layouts"
  step compare-h3-after 120 python -m ditprof compare --iters 5 --no-cuda-graph --out "$out/compare-h3-after"
  ;;
main)
  step compare-h3 250 python -m ditprof compare --out "$out/compare-h3"
  step validate-h3 220 python -m ditprof validate --preset h3 --blocks 50 --device cuda --steps 50 --cfg --out "$out/validate-h3"
  ;;
extra)
  step attention-bench 200 python benchmarks/attention.py --shapes h3 --iters 5 --json "$out/attention.json"
  step kernels-accuracy 60 python -m ditprof kernels accuracy --device cuda --json
  step sp1-nccl 60 python -m ditprof compare --preset h3-mini --device cuda --sp 1 --out "$out/sp1"
  step compare-16g 120 python -m ditprof compare --preset h3 --gpu-memory 16GiB --iters 5 --out "$out/compare-h3-16g"
  step gpu-tests 150 python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_fp8_kernel_gpu.py tests/test_validate.py tests/test_fp8_emulation.py
  ;;
diag)
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
probe)
  step mufu-wgmma 150 python benchmarks/experimental/mufu_wgmma_overlap.py --json "$out/mufu-wgmma-overlap.json"
  [ -n "${FINITE_TESTS:-}" ] && step finite-tests 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_finite_checks.py
  [ -n "${WITH_TESTS:-}" ] && step sm90-tests 300 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py
  ;;
final)
  step sm90-tests 300 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py
  step attention-bench 240 python benchmarks/attention.py --shapes h3 --iters 5 --json "$out/attention.json"
  ;;
compare)
  step compare-h3 280 python -m ditprof compare --out "$out/compare-h3"
  ;;
sweep)
  step sweep 400 python benchmarks/experimental/sm90_sweep.py --out "$out" --rounds 2 --iters 6 ${SWEEP_VARIANTS:+--variants $SWEEP_VARIANTS}
  timelines ${TIMELINE_OPTS:-}
  ;;
graphs)  # session 5: CUDA-graph replay timing (GPU tests, then compare on h3 and on two small blocks)
  step graph-tests 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graph.py
  step compare-h3 250 python -m ditprof compare --out "$out/compare-h3"
  for p in ${GRAPH_PRESETS:-ltx-video flux.1-dev cogvideox-5b}; do
    step "compare-$p" 150 python -m ditprof compare --preset "$p" --out "$out/compare-$p"
  done
  ;;
host)  # session 5: host overhead per attention call (launch paths), then graph tests + small-block compares
  step host-overhead 200 python benchmarks/host_overhead.py --json "$out/host_overhead.json"
  step tvm-test 150 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py -k tvm_ffi
  step graph-tests 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graph.py
  for p in ${GRAPH_PRESETS:-ltx-video flux.1-dev}; do
    step "compare-$p" 150 python -m ditprof compare --preset "$p" --out "$out/compare-$p"
  done
  [ -n "${FINITE_TESTS:-}" ] && step finite-tests 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_finite_checks.py
  [ -n "${WITH_TESTS:-}" ] && step sm90-tests 300 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py tests/test_fp8_kernel_gpu.py tests/test_prep.py
  ;;
sp)  # Ulysses over NCCL: the default block (h3) at SP degree P, then the same block on one GPU of this host
  P=${SP:-2}
  step "sp$P-h3" 330 python -m ditprof compare --device cuda --sp "$P" --out "$out/sp$P-h3"
  step sp1-h3 250 python -m ditprof compare --device cuda --out "$out/sp1-h3"
  ;;
sp-families)
  P=${SP:-2}
  for p in ${SP_PRESETS:-flux.1-dev ltx-video cogvideox-5b wan2.1-t2v-1.3b}; do
    step "sp$P-$p" 200 python -m ditprof compare --preset "$p" --device cuda --sp "$P" --iters 5 --out "$out/sp$P-$p"
  done
  ;;
timeline)
  timelines ${TIMELINE_OPTS:-default}
  ;;
lazy)  # session 4: lazy_max / pv_split=1 sweep + timelines (LAZY_TESTS=1: the lazy_max GPU tests instead)
  if [ -n "${LAZY_TESTS:-}" ]; then
    step lazy-tests 400 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py -k "lazy or vs_float64 or biased"
  else
    step sweep 330 python benchmarks/experimental/sm90_sweep.py --out "$out" --rounds 2 --iters 6 --variants ${SWEEP_VARIANTS:-default,lazy,split1,lazy-split1}
    timelines ${TIMELINE_OPTS:-lazy_max=True}
  fi
  ;;
issue6)
  step accuracy-table 330 python -m ditprof accuracy-table --device cuda --out "$out/accuracy-table"
  step feasibility 300 python benchmarks/feasibility.py --device cuda --json "$out/feasibility-cuda.json"
  step sm90-tests 240 python -m pytest -q -m gpu -p no:cacheprovider benchmarks/experimental/test_fp8_sm90_variants_gpu.py
  ;;
esac
# at most 8 files come back: pack the folders and the logs
( cd "$out" && for d in */; do [ -d "$d" ] && tar czf "${d%/}.tgz" "$d" && rm -rf "$d"; done
  tar czf "logs-${1:-main}.tgz" ./*.log gpu.txt 2>/dev/null && rm -f ./*.log )
cat "$out/summary.txt"
