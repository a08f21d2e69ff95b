"""Writes cuda_synthetic.trace.json: a small kineto-like CUDA trace (2 block calls) for the category tests.

Per block call (µs of device time): attention 410 (an unknown-named CuTe kernel launched through the driver
API inside ``ditprof::attention`` plus an elementwise kernel inside the same range), gemm 360 (addmm via
correlation + mm linked only by External id), norm 50, elementwise 30 (an add, plus a Triton kernel with no
host link that falls back to its name inside the GPU-side block range), other 20 (a reduction).
A copy kernel launched outside the block range must not count.
Run ``python tests/data/traces/make_cuda_synthetic.py`` to regenerate.
"""

import json
from pathlib import Path

PID, TID, DEV, STREAM = 4242, 4242, 0, 7


def trace() -> dict:
    ev = []
    corr = [0]
    ext = [0]

    def host(name, cat, ts, dur, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur,
                   "args": args})

    def op(name, ts, dur):
        ext[0] += 1
        host(name, "cpu_op", ts, dur, **{"External id": ext[0]})
        return ext[0]

    def kernel(name, ts, dur, c, e):
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": DEV, "tid": STREAM, "ts": ts, "dur": dur,
                   "args": {"External id": e, "correlation": c, "device": DEV, "stream": STREAM}})

    def launch(api, ts, k_name, k_ts, k_dur, e, cat="cuda_runtime", link=True):
        corr[0] += 1
        if link:
            host(api, cat, ts, 5, **{"External id": e, "correlation": corr[0], "cbid": 211})
        kernel(k_name, k_ts, k_dur, corr[0], e)

    for it in range(2):
        o = it * 10000.0
        ext[0] += 1
        host("ditprof::block", "user_annotation", o + 1000, 1000, **{"External id": ext[0]})
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": "ditprof::block", "pid": DEV, "tid": STREAM,
                   "ts": o + 1100, "dur": 890, "args": {"External id": ext[0]}})
        op("aten::linear", o + 1010, 90)
        e = op("aten::addmm", o + 1020, 70)
        launch("cudaLaunchKernel", o + 1030, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", o + 1100,
               300, e)
        op("aten::layer_norm", o + 1110, 40)
        e = op("aten::native_layer_norm", o + 1115, 30)
        launch("cudaLaunchKernel", o + 1120,
               "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
               o + 1400, 50, e)
        ext[0] += 1
        host("ditprof::attention", "user_annotation", o + 1160, 140, **{"External id": ext[0]})
        launch("cuLaunchKernelEx", o + 1170, "kernel_cutlass_kernel_ditprofkernelsfp8_fwd_0", o + 1450, 400, ext[0],
               cat="cuda_driver")
        e = op("aten::mul", o + 1200, 20)
        launch("cudaLaunchKernel", o + 1205, "void at::native::elementwise_kernel<128, 4>", o + 1850, 10, e)
        e = op("aten::add", o + 1310, 20)
        launch("cudaLaunchKernel", o + 1315, "void at::native::vectorized_elementwise_kernel<4, add>", o + 1860, 20, e)
        e = op("aten::sum", o + 1340, 20)
        launch("cudaLaunchKernel", o + 1345, "void at::native::reduce_kernel<512, 1>", o + 1880, 20, e)
        e = op("aten::mm", o + 1370, 20)  # its runtime event is missing: External id is the only link
        launch("cudaLaunchKernel", o + 1375, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", o + 1900, 60, e, link=False)
        corr[0] += 1  # no host link at all: the kernel name decides, inside the GPU block range
        kernel("triton_poi_fused_mul_0", o + 1960, 10, corr[0], 999999)
        # outside the block range: must not count
        e = op("aten::copy_", o + 2090, 30)
        launch("cudaLaunchKernel", o + 2100, "void at::native::elementwise_kernel<copy>", o + 2200, 10, e)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "synthetic"}], "traceEvents": ev}


if __name__ == "__main__":
    out = Path(__file__).with_name("cuda_synthetic.trace.json")
    out.write_text(json.dumps(trace(), indent=0))
    print(out)
