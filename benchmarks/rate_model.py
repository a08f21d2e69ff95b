"""A rate MODEL, not a measurement: the predicted time of our FP8 attention kernels at one shape on GPUs we do not
have (RTX 5080 / 5090, sm_120; RTX 4090, sm_89) and on the H100 we measured, from published per-instruction rates
(the table ``ARCH_RATES`` / ``DEVICES`` below, every number with its source) and the kernels' own instruction counts.

The counts are read from the SASS of the kernel's key loop (one 32-key strip of fp8-sm120, one key tile of
fp8-sm90), compiled offline on any machine (``ditprof kernels inspect`` does the same compile). Per work unit
(one CTA x one strip / key tile) the model takes, in SM clock cycles:

* tensor: sum over the loop's MMA instructions of (ops of the instruction / the form's dense ops per clock per SM);
* MUFU: exp2 / rcp / lg2 lanes / the SFU's 16 per clock per SM;
* FP32: FFMA + FMUL + FADD lanes / 128 per clock per SM;
* issue: every instruction of the loop, one warp instruction per sub-partition per clock (4 per SM).

``overlap`` = the largest of the four (every pipe busy all the time, perfect overlap); ``serial`` = tensor + the
largest non-tensor term (the softmax never overlaps the MMAs). Units are spread over the SMs in waves of
``SMs x resident CTAs`` (a partial last wave costs a whole one). A measured time divided into ``overlap`` is the
"achieved fraction" of the bound; the alternative P V forms are predicted at the fraction the shipped one achieved.

    python benchmarks/rate_model.py [--shape B,H,S,D] [--json PATH] [--no-json]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, results_path, write_json  # noqa: E402  (benchmarks/, the script's own folder)

from ditprof.kernels.inspect_sass import loop_bodies  # noqa: E402

H3 = (1, 56, 30272, 128)  # MiniMax-H3 attention: B, H, S (packed rows), D; non-causal self-attention


@dataclass(frozen=True)
class Rate:
    """Dense ops per clock per SM of one instruction form (2 ops per multiply-add), and where it comes from."""

    per_clk_sm: float | None  # None: the form does not exist on that architecture
    source: str


# ---- the rate table: per architecture, per instruction form (ops / clock / SM, dense) -----------------------------
_WP_ADA = ("NVIDIA Ada GPU Architecture whitepaper v2.02+, Appendix A (GeForce RTX 4090, boost 2520 MHz, 128 SMs), "
           "as quoted in public repos (the PDF itself was not in the stored corpus)")
_WP_RTXBW = ("NVIDIA RTX Blackwell GPU Architecture whitepaper, Appendix A Table 3 (RTX 5090, boost 2407 MHz, 170 SMs)"
             ", as quoted by gau-nernst.github.io/nvrtc-matmul (2025-09-06) and a public repo")
_PR4149 = "flashinfer-ai/flashinfer#4149 (RTX 5090, register-resident mma_peak probe)"
_RFC3628 = "flashinfer-ai/flashinfer#3628 (RTX 5060 Ti, same probe)"
ARCH_RATES: dict[str, dict[str, Rate]] = {
    "sm_120": {
        "hmma_bf16_f32": Rate(512, f"{_WP_RTXBW}: FP16/BF16 with FP32 acc 209.5 TFLOPS = 512 x 170 x 2.407 GHz; "
                                   f"{_PR4149}: HMMA.16816.F32 ~253 TFLOP/s (at the card's real clock)"),
        "qmma_f32": Rate(1024, f"{_PR4149}: QMMA.16832.F32.E4M3.E4M3 ~506 TFLOP/s, half of QMMA.SF's ~993 (derived: "
                               f"half of 2048); {_RFC3628}: 102 vs 206 with FP16 acc"),
        "qmma_f16": Rate(2048, f"{_RFC3628}: QMMA.16832.F16.E4M3.E4M3 ~206 TFLOP/s = 2x the F32 form; "
                               f"{_WP_RTXBW}: FP16 acc 419 = 2x 209.5 (derived: full rate, 2x qmma_f32)"),
        "qmma_sf": Rate(2048, f"{_PR4149}: QMMA.SF.16832.F32.E4M3.E4M3.E8 ~993 TFLOP/s on RTX 5090 (= 2048 x 170 x "
                              f"~2.85 GHz); {_RFC3628}: ~202 on GB206, not throttled by FP32 accumulation"),
        "imma_s8": Rate(2048, "kekzl/imp#254: mma.sync m16n8k32 s32.s8.s8.s32 931 TOPS on RTX 5090 (sm_120a); "
                              "derived: the full 2048 tier (931 = 2048 x 170 x 2.67 GHz)"),
        "mufu": Rate(16, "CUDA C++ Programming Guide, arithmetic-instruction throughput: 16 results/clk/SM for "
                         "exp2/rcp/lg2 (read here for cc 7.x; assumed unchanged for 8.9 / 12.0: not verified)"),
        "fp32": Rate(128, "RTX Blackwell whitepaper: 128 FP32 lanes per SM (FP32 104.8 TFLOPS = 2 x 21760 x "
                          "2.407 GHz)"),
        "issue": Rate(4, "4 sub-partitions per SM, one warp instruction each per clock (SM diagram)"),
    },
    "sm_89": {
        "hmma_bf16_f32": Rate(512, f"{_WP_ADA}: BF16 with FP32 acc 165.2 TFLOPS = 512 x 128 x 2.52 GHz"),
        "qmma_f32": Rate(1024, f"{_WP_ADA}: FP8 with FP32 acc 330.3 TFLOPS (corrected in v2.02 from 660.6)"),
        "qmma_f16": Rate(2048, f"{_WP_ADA}: FP8 with FP16 acc 660.6 TFLOPS"),
        "qmma_sf": Rate(None, "no kind::mxf8f6f4 block-scaled mma.sync before sm_120"),
        "imma_s8": Rate(2048, f"{_WP_ADA}: INT8 660.6 TOPS"),
        "mufu": Rate(16, "CUDA C++ Programming Guide (assumed as for sm_120; not verified for 8.9)"),
        "fp32": Rate(128, f"{_WP_ADA}: FP32 82.6 TFLOPS = 2 x 16384 x 2.52 GHz"),
        "issue": Rate(4, "4 sub-partitions per SM"),
    },
    "sm_90": {
        "wgmma_bf16": Rate(4096, "NVIDIA/cudnn-frontend#650: 989.5 dense BF16 = 132 SMs x 1.83 GHz x 4096"),
        "wgmma_fp8": Rate(8192, "NVIDIA/cudnn-frontend#650: FP8 dense is 2x BF16 (H100 datasheet 1979 TFLOPS)"),
        "wgmma_int8": Rate(8192, "H100 datasheet INT8 1979 TOPS dense = 8192 x 132 x 1.83 GHz (derived)"),
        "mufu": Rate(16, "NVIDIA/cudnn-frontend#1178: MUFU.EX2 16.00/clk/SM measured on sm_100a; FlashAttention-3 "
                         "paper: H100 SXM5 3.9 TFLOPS of special functions = 16 x 132 x 1.83 GHz"),
        "fp32": Rate(128, "H100 FP32 66.9 TFLOPS = 2 x 16896 x 1.98 GHz"),
        "issue": Rate(4, "4 sub-partitions per SM"),
    },
}


@dataclass(frozen=True)
class Device:
    name: str
    arch: str
    sms: int
    boost_mhz: float  # the clock the datasheet peaks assume
    mem_gbps: float
    smem_per_sm: int  # bytes a CTA set may use per SM
    source: str
    sustained_mhz: float | None = None  # a published in-kernel clock under MMA load, where one exists
    sustained_source: str = ""
    regs_per_sm: int = 65536


DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("rtx5080", "sm_120", 84, 2617, 960, 100 * 1024,
           "RTX 5080 (GB203): 84 SMs, boost 2617 MHz, 16 GB GDDR7 256-bit 960 GB/s (NVIDIA RTX 5080 specs / RTX "
           "Blackwell whitepaper, as tabulated in lamonoai/gpumap); 100 KB smem per SM (CUDA guide, cc 12.0)"),
    Device("rtx5090", "sm_120", 170, 2407, 1792, 100 * 1024,
           "RTX 5090 (GB202): 170 SMs, boost 2407 MHz, 32 GB GDDR7 512-bit 1792 GB/s (RTX Blackwell whitepaper "
           "Table 3 via gau-nernst.github.io/nvrtc-matmul and Linux Format May 2025 review)",
           sustained_mhz=2875, sustained_source="Neroued/ninfer#160: 2.87-2.88 GHz read by clock64() inside an "
                                                "MMA loop on one RTX 5090 (525 W cap)"),
    Device("rtx4090", "sm_89", 128, 2520, 1008, 100 * 1024,
           f"{_WP_ADA}: 128 SMs, boost 2520 MHz, 1008 GB/s"),
    Device("h100-sxm", "sm_90", 132, 1830, 3352, 227 * 1024,
           "H100 SXM5: 132 SMs, 3.35 TB/s (datasheet); 1830 MHz is the clock the 989.5 / 1979 TFLOPS peaks imply "
           "(NVIDIA/cudnn-frontend#650)"),
)}

# Measurements to set the model against (not ours unless said so)
MEASURED = {
    "rtx5080": (123.6, "the design write-up's measurement (issue 44), RTX 5080, h3 with 56 heads: fp8-sm120 123.6 ms "
                       "vs FlashInfer 131.8 ms vs cuDNN BF16 226.2 ms -- not measured by us"),
    "h100-sxm": (25.702, "ours, benchmarks/NOTES.md session 21: fp8-sm90 INT8 kernel alone at h3 on one H100 80GB "
                         "HBM3, 25.70 ms (call span 26.54 ms; session 20 attention.py incl. prep 27.34 ms)"),
}

# The P V forms the sm_120 model compares (rate-table key of the QMMA the P V mma would be)
PV_FORMS = {
    "as shipped (QMMA F32 acc, half rate)": "qmma_f32",
    "block-scaled QMMA.SF (full rate, FP32 acc)": "qmma_sf",
    "QMMA F16 acc (full rate; SageAttention2++)": "qmma_f16",
}

_MMA = re.compile(r"\b([QIH])(G?)MMA\.(?:(\d+)x(\d+)x(\d+)|(\d\d)(\d)(\d\d))\b")
_FORM = {("I", ""): "imma_s8", ("Q", ""): "qmma_f32", ("H", ""): "hmma_bf16_f32",
         ("I", "G"): "wgmma_int8", ("Q", "G"): "wgmma_fp8", ("H", "G"): "wgmma_bf16"}


def mma_ops(instr: str) -> tuple[str, int] | None:
    """(rate-table form, dense ops) of one SASS MMA instruction: ``QMMA.16832...`` (m16 n8 k32) or
    ``IGMMA.64x160x32...`` (m64 n160 k32); None for any other instruction."""
    m = _MMA.search(instr)
    if not m:
        return None
    kind, g = m.group(1), m.group(2)
    if m.group(3):
        mm, nn, kk = int(m.group(3)), int(m.group(4)), int(m.group(5))
    else:
        mm, nn, kk = int(m.group(6)), int(m.group(7)), int(m.group(8))
    form = _FORM[(kind, g)]
    if form == "qmma_f32" and ".F16." in instr.split("QMMA", 1)[1][:12]:
        form = "qmma_f16"
    return form, 2 * mm * nn * kk


def key_loop(sass: str) -> list[str]:
    """The kernel's key loop: the smallest backward-branch range that holds an MMA, an exp2 and no global store."""
    cands = [b for b in loop_bodies(sass) if any(mma_ops(x) for x in b) and any("MUFU.EX2" in x for x in b)
             and not any(re.search(r"\bSTG\b", x) for x in b)]
    if not cands:
        raise ValueError("no key loop (backward branch over MMA + MUFU.EX2, no STG) in the SASS")
    return min(cands, key=len)


def loop_counts(body: list[str]) -> dict:
    """Per-warp counts of one loop pass: instructions, MMA ops per form (a wgmma's ops are its warpgroup's: a
    quarter of them per warp), MUFU, FP32 (FFMA/FMUL/FADD) and the opcode histogram."""
    ops: dict[str, int] = {}
    mma_instr: dict[str, int] = {}
    hist: dict[str, int] = {}
    for x in body:
        op = re.sub(r"^@!?U?P\w+\s+", "", x).split()[0]
        base = op.split(".")[0]
        hist[base] = hist.get(base, 0) + 1
        mo = mma_ops(x)
        if mo:
            ops[mo[0]] = ops.get(mo[0], 0) + (mo[1] / 4 if mo[0].startswith("wgmma") else mo[1])
            mma_instr[op] = mma_instr.get(op, 0) + 1
    fp32 = sum(hist.get(k, 0) for k in ("FFMA", "FMUL", "FADD"))
    return {"instructions": len(body), "mma_ops": ops, "mma_instructions": mma_instr, "mufu": hist.get("MUFU", 0),
            "fp32": fp32, "opcodes": dict(sorted(hist.items(), key=lambda kv: -kv[1]))}


# ---- the kernels' geometry -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelGeometry:
    """What one work unit of a kernel is: ``rows`` query rows x ``keys`` keys, run by ``loop_warps`` warps each
    executing the key loop once per unit; a CTA has ``threads`` threads."""

    kernel: str
    arch: str
    rows: int
    keys: int
    loop_warps: int
    threads: int


def geometry(kernel: str, head_dim: int) -> KernelGeometry:
    if kernel == "fp8-sm120":
        from ditprof.kernels import fp8_fwd_sm120 as k

        return KernelGeometry(kernel, "sm_120a", k.M_BLOCK, k.N_BLOCK, k.NUM_THREADS // 32, k.NUM_THREADS)
    if kernel == "fp8-sm90":
        from ditprof.kernels.fp8_fwd_sm90 import config_for

        cfg = config_for("sm_90a", head_dim)
        return KernelGeometry(kernel, "sm_90a", 64 * cfg.consumer_wgs, cfg.tile_n, 4 * cfg.consumer_wgs,
                              128 * (cfg.consumer_wgs + 1))
    raise ValueError(f"no geometry for kernel {kernel!r}")


def work_units(shape: tuple, rows: int, keys: int) -> tuple[int, int]:
    """(CTAs, key units per CTA) of a non-causal self-attention of ``shape`` = (B, H, S, D)."""
    b, h, s, _d = shape
    return b * h * math.ceil(s / rows), math.ceil(s / keys)


def resident_ctas(dev: Device, threads: int, registers: int, smem_bytes: int) -> int:
    """CTAs one SM holds: registers (allocated in units of 8 per thread) and shared memory."""
    regs = math.ceil(registers / 8) * 8 * threads
    by_regs = dev.regs_per_sm // regs if regs else 1 << 30
    by_smem = dev.smem_per_sm // smem_bytes if smem_bytes else 1 << 30
    return max(1, min(by_regs, by_smem))


def unit_cycles(counts: dict, warps: int, rates: dict[str, Rate], swap: dict[str, str] | None = None) -> dict:
    """SM cycles per work unit, per pipe. ``swap``: {form in the SASS: form to price it at} (e.g. the P V QMMA
    priced as the block-scaled form, same instruction count)."""
    swap = swap or {}
    tensor = 0.0
    for form, ops in counts["mma_ops"].items():
        rate = rates[swap.get(form, form)].per_clk_sm
        if rate is None:
            raise ValueError(f"{swap.get(form, form)} does not exist on this architecture")
        tensor += ops * warps / rate
    return {
        "tensor": tensor,
        "mufu": counts["mufu"] * 32 * warps / rates["mufu"].per_clk_sm,
        "fp32": counts["fp32"] * 32 * warps / rates["fp32"].per_clk_sm,
        "issue": counts["instructions"] * warps / rates["issue"].per_clk_sm,
    }


def wave_factor(ctas: int, slots: int) -> float:
    """Whole waves over the ideal fractional number: a partial last wave costs a full one."""
    return math.ceil(ctas / slots) / (ctas / slots)


def dram_bytes(shape: tuple) -> int:
    """The least DRAM traffic of the kernel: Q, K, V read once as 8-bit codes, O written once in bf16."""
    b, h, s, d = shape
    return b * h * s * d * (1 + 1 + 1 + 2)


def predict_ms(cyc: dict, units: int, dev: Device, slots: int, ctas: int, mhz: float | None = None,
               nbytes: int = 0) -> dict:
    """Milliseconds of the bound terms for ``units`` work units spread over ``dev``'s SMs (and ``nbytes`` of DRAM
    traffic at the datasheet bandwidth)."""
    clock = (mhz or dev.boost_mhz) * 1e6
    scale = units / dev.sms / clock * 1e3 * wave_factor(ctas, slots)
    terms = {k: v * scale for k, v in cyc.items()}
    terms["dram"] = nbytes / (dev.mem_gbps * 1e9) * 1e3
    nontensor = max(terms["mufu"], terms["fp32"], terms["issue"], terms["dram"])
    return {**terms, "overlap": max(terms["tensor"], nontensor), "serial": terms["tensor"] + nontensor}


# Published whole-GPU numbers, to check the per-SM-per-clock table against: (device, form, TFLOP/s or TOPS, clock
# MHz it was taken at -- None: the device's boost -- spec or measured, source)
PUBLISHED = [
    ("rtx4090", "hmma_bf16_f32", 165.2, None, "spec", _WP_ADA),
    ("rtx4090", "qmma_f32", 330.3, None, "spec", _WP_ADA),
    ("rtx4090", "qmma_f16", 660.6, None, "spec", _WP_ADA),
    ("rtx4090", "imma_s8", 660.6, None, "spec", _WP_ADA),
    ("rtx5090", "hmma_bf16_f32", 209.5, None, "spec", _WP_RTXBW),
    ("rtx5090", "fp4_f32 (OMMA.SF, not used)", 1676.0, None, "spec",
     "RTX Blackwell whitepaper Appendix A Table 3, Peak FP4 Tensor TFLOPS with FP32 Accumulate 1676/3352 (quoted in a "
     "public repo); 4096/clk/SM"),
    ("rtx5080", "fp4_f32 (OMMA.SF, not used)", 1801.0 / 2, None, "spec",
     "RTX 5080 AI TOPS 1801 (FP4, sparse) per NVIDIA's RTX 5080 specs, halved for dense (via a public GB203 write-up)"),
    ("rtx5090", "hmma_bf16_f32", 253.0, 2875, "measured", _PR4149),
    ("rtx5090", "qmma_f32", 506.0, 2875, "measured", _PR4149),
    ("rtx5090", "qmma_sf", 993.0, 2875, "measured", _PR4149),
    ("rtx5090", "imma_s8", 931.0, 2875, "measured", "kekzl/imp#254 (clock not stated; 2875 MHz assumed, ninfer#160)"),
    ("rtx5090", "qmma_f32 (GEMM)", 465.0, 2875, "measured", "gau-nernst.github.io/nvrtc-matmul: FP8 GEMM 8192^3, 600 W"),
    ("rtx5090", "qmma_f16 (GEMM)", 692.0, 2875, "measured", "gau-nernst.github.io/nvrtc-matmul: FP8 FP16-acc GEMM"),
    ("rtx5090", "imma_s8 (GEMM)", 736.0, 2875, "measured", "gau-nernst.github.io/nvrtc-matmul: INT8 GEMM 8192^3"),
    ("h100-sxm", "wgmma_bf16", 989.5, None, "spec", "NVIDIA/cudnn-frontend#650 / H100 datasheet"),
    ("h100-sxm", "wgmma_fp8", 1979.0, None, "spec", "H100 datasheet (3958 sparse)"),
]


def implied_per_clk(value_t: float, dev: Device, mhz: float | None) -> float:
    """Ops per clock per SM a whole-GPU figure (T ops/s) implies at ``mhz`` (None: the boost clock)."""
    return value_t * 1e12 / (dev.sms * (mhz or dev.boost_mhz) * 1e6)


def device_peak_t(form: str, dev: Device, mhz: float | None = None) -> float | None:
    """The table's rate of ``form`` on ``dev`` as T ops/s at ``mhz`` (None: boost)."""
    r = ARCH_RATES[dev.arch][form].per_clk_sm
    return None if r is None else r * dev.sms * (mhz or dev.boost_mhz) * 1e6 / 1e12


def kernel_counts(kernel: str, arch: str, head_dim: int, qk_format: str) -> tuple[dict, dict]:
    """(per-warp loop counts, ``inspect_kernel``'s report) of one build, compiled here (no GPU needed)."""
    import tempfile

    from ditprof.kernels.inspect_sass import inspect_kernel

    with tempfile.TemporaryDirectory(prefix="rate-model-") as tmp:
        path = str(Path(tmp) / "k.sass")
        rep = inspect_kernel(kernel, arch, head_dim=head_dim, keep_sass=path, qk_format=qk_format)
        sass = Path(path).read_text()
    return loop_counts(key_loop(sass)), rep


def model_rows(kernel: str, dev_names: list[str], shape: tuple, qk_format: str, builds: dict) -> list[dict]:
    """One row per (device, P V form, clock) of ``kernel`` at ``shape``; ``builds`` caches compiled counts per arch."""
    geo = geometry(kernel, shape[3])
    ctas, per_cta = work_units(shape, geo.rows, geo.keys)
    rows = []
    for name in dev_names:
        dev = DEVICES[name]
        arch = "sm_89" if dev.arch == "sm_89" else geo.arch
        if (kernel, arch) not in builds:
            builds[(kernel, arch)] = kernel_counts(kernel, arch, shape[3], qk_format)
        counts, rep = builds[(kernel, arch)]
        slots = dev.sms * resident_ctas(dev, geo.threads, rep["registers"], rep["smem_bytes"])
        forms = PV_FORMS if kernel == "fp8-sm120" else {"as shipped (wgmma)": None}
        for label, form in forms.items():
            if form and ARCH_RATES[dev.arch][form].per_clk_sm is None:
                continue
            cyc = unit_cycles(counts, geo.loop_warps, ARCH_RATES[dev.arch], {"qmma_f32": form} if form else None)
            for mhz in (dev.boost_mhz, dev.sustained_mhz):
                if mhz:
                    ms = predict_ms(cyc, ctas * per_cta, dev, slots, ctas, mhz, dram_bytes(shape))
                    rows.append({"device": name, "kernel": kernel, "arch": arch, "pv_form": label, "mhz": mhz,
                                 "ctas": ctas, "units_per_cta": per_cta, "resident_ctas": slots // dev.sms,
                                 "wave_factor": wave_factor(ctas, slots), "cycles_per_unit": cyc, "ms": ms})
    return rows


def calibrate(rows: list[dict]) -> None:
    """Set each row's ``measured_ms`` (where MEASURED has its device and the row is the shipped form at the boost
    clock), ``achieved`` (overlap bound / measured) and ``predicted_ms`` (its overlap bound at the achieved fraction
    of a measured row: its own device's, else the RTX 5080's for sm_120 / sm_89 rows, said in ``fraction_from``)."""
    frac = {}
    for r in rows:
        m = MEASURED.get(r["device"])
        if m and r["pv_form"].startswith("as shipped") and r["mhz"] == DEVICES[r["device"]].boost_mhz:
            r["measured_ms"] = m[0]
            r["achieved"] = r["ms"]["overlap"] / m[0]
            frac[r["device"]] = r["achieved"]
    for r in rows:
        src = r["device"] if r["device"] in frac else ("rtx5080" if r["kernel"] == "fp8-sm120" else None)
        if src in frac:
            r["fraction_from"] = src
            r["predicted_ms"] = r["ms"]["overlap"] / frac[src]


def md_table(columns: list[str], rows: list[list]) -> str:
    def cell(x):
        if isinstance(x, float):
            return f"{x:.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"
        return "-" if x is None else str(x)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def rate_table() -> str:
    cols = ["arch", "form", "ops/clk/SM"] + [f"{d} T/s @boost" for d in DEVICES] + ["source"]
    rows = []
    for arch, forms in ARCH_RATES.items():
        for form, rate in forms.items():
            if form in ("mufu", "fp32", "issue"):
                continue
            peaks = [device_peak_t(form, d) if d.arch == arch else None for d in DEVICES.values()]
            rows.append([arch, form, rate.per_clk_sm, *peaks, rate.source])
    return md_table(cols, rows)


def published_table() -> str:
    rows = []
    for dev, form, value, mhz, kind, src in PUBLISHED:
        d = DEVICES[dev]
        rows.append([dev, form, value, kind, mhz or d.boost_mhz, implied_per_clk(value, d, mhz), src])
    return md_table(["device", "form", "T/s", "kind", "at MHz", "implied ops/clk/SM", "source"], rows)


def model_table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        ms = r["ms"]
        out.append([r["device"], r["pv_form"], r["mhz"], ms["tensor"], ms["mufu"], ms["fp32"], ms["issue"],
                    ms["dram"], ms["overlap"], ms["serial"], r.get("measured_ms"), r.get("achieved"),
                    r.get("predicted_ms"), r.get("fraction_from")])
    return md_table(["device", "P V form", "MHz", "tensor ms", "MUFU ms", "FP32 ms", "issue ms", "DRAM ms", "overlap ms",
                     "serial ms", "measured ms", "achieved", "predicted ms", "fraction of"], out)


def counts_table(builds: dict) -> str:
    rows = []
    for (kernel, arch), (c, rep) in builds.items():
        mma = ", ".join(f"{k} x{v}" for k, v in c["mma_instructions"].items())
        rows.append([kernel, arch, c["instructions"], mma, c["mufu"], c["fp32"], rep["registers"], rep["smem_bytes"]])
    return md_table(["kernel", "arch", "loop instr / warp", "MMA / warp", "MUFU / warp", "FFMA+FMUL+FADD / warp",
                     "registers", "smem B"], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default=",".join(map(str, H3)), help="B,H,S,D (default h3: 1,56,30272,128)")
    ap.add_argument("--qk-format", default="int8", choices=["int8", "e4m3"])
    ap.add_argument("--json", default=None, help="output path (default benchmarks/results/rate-model-DATE.json)")
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    if len(shape) != 4:
        raise SystemExit("--shape takes B,H,S,D")
    builds: dict = {}
    rows = model_rows("fp8-sm120", ["rtx5080", "rtx5090", "rtx4090"], shape, args.qk_format, builds)
    rows += model_rows("fp8-sm90", ["h100-sxm"], shape, args.qk_format, builds)
    calibrate(rows)
    print("MODEL, not a measurement. Shape B,H,S,D =", shape, "non-causal, Q/K", args.qk_format, "\n")
    print("Rates (dense):\n" + rate_table() + "\n")
    print("Published whole-GPU numbers vs the table:\n" + published_table() + "\n")
    print("Key-loop counts (per warp, one strip / key tile):\n" + counts_table(builds) + "\n")
    print("Model:\n" + model_table(rows))
    if not args.no_json:
        payload = {"kind": "model, not a measurement", "shape": shape, "qk_format": args.qk_format,
                   "arch_rates": {a: {f: vars(r) for f, r in fs.items()} for a, fs in ARCH_RATES.items()},
                   "devices": {n: vars(d) for n, d in DEVICES.items()}, "measured": MEASURED,
                   "published": PUBLISHED, "counts": {f"{k}/{a}": c for (k, a), (c, _r) in builds.items()},
                   "rows": rows, "environment": environment()}
        print("\nwrote", write_json(payload, Path(args.json) if args.json else results_path("rate-model")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
