"""FlashAttention-3 FP8's inputs made from the raw projections by the same fused prologue as our prep: the peer of
``prep.fp8_prepare_prologue`` for the fair comparison (FA3 FP8 fed by our fused norm + RoPE).

``fa3_prologue_inputs(q, k, v, spec, wq=, wk=, cos=, sin=, text_rows=)`` reads raw 16-bit q, k (the projections'
output, any strides), v, the norm weights and the rotary table as ``prep.fp8_prepare_prologue`` takes them, and
returns what ``fa3_fwd_interface.flash_attn_func`` takes: q8, k8, v8 e4m3 (B, S, H, D) contiguous and the descales
dq, dk, dv float32 (B, H) (views of one (3, B, H) tensor).

Numerics (the torch chain ``prologue.prologue_torch`` then per-(batch, head) quantization, as
benchmarks/attention.py's ``quantize_per_head``): n = the prologue's value of each element of q and k (fp32 norm +
RoPE, one rounding to the inputs' dtype: ``prep_triton._prologue_rows``, imported, not rewritten), v as it is;
descale = amax|n| over (S, D) / 448 (IEEE division; 1.0 where the amax is 0; NaN where the input holds a NaN, no
check or sync here); codes e4m3(RN(n / descale)) (the correctly rounded quotient, ``prep_triton._div_by_descale``,
round to nearest even, saturating). No K smoothing, no rotation, no padding, no key order: FA3's format.

Two launches, deterministic (no atomics):

1. ``_stats_kernel`` grid (3 * NC, B * H): program (op * NC + c, b * H + h) takes rows [c * CHUNK, (c + 1) * CHUNK)
   of operand op (q, k, v) of one (b, h) and stores amax|n| as int32 bits of |n| (an integer max keeps a NaN,
   which sorts above Inf) in ``part`` (3, B * H, NC). q and k: [ROWS, D] tiles through the prologue
   (``_load_rows_pro``), folded elementwise into an int32 [ROWS, D] accumulator, one reduction at the end; v: our
   prep's raw-bits amax (``_stats_amax``: 16-byte loads, several sub-tiles in flight).
2. ``_quant_kernel`` grid (3 * NT, B * H): each program first reduces its operand's NC partials (a few hundred bytes
   from L2, the same fixed order in every program: the tiny reduce, without a launch of its own) to the descale
   (the tile-0 program stores it), then quantizes QUANT_ROWS rows, ROWS at a time (q and k through the prologue
   again: recomputing is cheaper than a round trip of the normed rows through memory) and stores them row-major.

The launches are ``FixedLaunch``es of a plan cached per call signature (shapes, strides, dtypes, alignment, spec,
weight rows, launch configuration), so a repeated call pays two launches and the output allocations. Under the
Triton interpreter (``TRITON_INTERPRET=1``, CPU tensors) the kernels round to bf16 and e4m3 in fp32 themselves
(``INTERP``), as the prep's do.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ditprof.errors import DitprofError
from ditprof.kernels.checks import check_qkv
from ditprof.kernels.fp8_config import Fa3PrologueConfig, PrepConfig
from ditprof.kernels.prep_triton import (INTERPRET, _abs_bits, _div_by_descale, _load_rows_pro, _PRO_ARGS,
                                         _stats_amax, _to_e4m3, chunk_for_grid, prologue_constants,
                                         stats_rows_per_warp)
from ditprof.kernels.prologue import PrologueSpec, check_prologue_call, prologue_tensors
from ditprof.kernels.triton_launch import FixedLaunch

E4M3_MAX = 448.0


@triton.jit
def _amax_pro(src, s_b, s_s, s_h, s_d, part_ptr, b, h, bh64, c, S, NC, w_ptr, cos_ptr, sin_ptr, text_rows, eps,
              D: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr, PRO_NORM: tl.constexpr,
              PRO_ROPE: tl.constexpr, PRO_R: tl.constexpr, PRO_G2: tl.constexpr, INTERP: tl.constexpr):
    # amax|prologue(x)| over rows [c*CHUNK, min((c+1)*CHUNK, S)) of one (b, h), as |x| bits; rows past the end come
    # out of the prologue as exact zeros, so no row mask is needed in the fold
    base = src + b * s_b + h * s_h
    start = c * CHUNK
    end = tl.minimum(start + CHUNK, S)
    d = tl.arange(0, D).to(tl.int64)
    acc = tl.zeros([ROWS, D], dtype=tl.int32)
    for first in range(start, end, ROWS):
        x = _load_rows_pro(base, s_s, s_d, first, end, d, ROWS, w_ptr, cos_ptr, sin_ptr, text_rows, eps, D, True,
                           PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, INTERP)
        acc = tl.maximum(acc, _abs_bits(x.to(tl.float32)))
    tl.store(part_ptr + bh64 * NC + c, tl.max(tl.max(acc, axis=1), axis=0))


@triton.jit(do_not_specialize=["text_rows"])  # per call: a value 1 or a multiple of 16 must not be baked in
def _stats_kernel(
    q_ptr, k_ptr, v_ptr,
    sqb, sqs, sqh, sqd,
    skb, sks, skh, skd,
    svb, svs, svh, svd,
    part_ptr, BH, S, NC,
    wq_ptr, wk_ptr, cos_ptr, sin_ptr, text_rows, eps,
    H: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr, R: tl.constexpr, W: tl.constexpr,
    INTERP: tl.constexpr,
    PRO: tl.constexpr, PRO_NORM: tl.constexpr, PRO_ROPE: tl.constexpr, PRO_R: tl.constexpr, PRO_G2: tl.constexpr,
):
    t = tl.program_id(0)
    op = t // NC
    c = t % NC
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    if op == 0:
        _amax_pro(q_ptr, sqb, sqs, sqh, sqd, part_ptr, b, h, bh64, c, S, NC, wq_ptr, cos_ptr, sin_ptr, text_rows,
                  eps, D, CHUNK, ROWS, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, INTERP)
    elif op == 1:
        _amax_pro(k_ptr, skb, sks, skh, skd, part_ptr + BH * NC, b, h, bh64, c, S, NC, wk_ptr, cos_ptr, sin_ptr,
                  text_rows, eps, D, CHUNK, ROWS, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, INTERP)
    else:
        _stats_amax(v_ptr, svb, svs, svh, svd, part_ptr + 2 * BH * NC, b, h, bh64, c, S, NC, D, CHUNK, R, W)


@triton.jit
def _quant_op(src, s_b, s_s, s_h, s_d, dst, part_ptr, desc_ptr, b, h, bh64, tile, S, NC, w_ptr, cos_ptr, sin_ptr,
              text_rows, eps, H: tl.constexpr, D: tl.constexpr, NCP: tl.constexpr, QUANT_ROWS: tl.constexpr,
              ROWS: tl.constexpr, PRO: tl.constexpr, PRO_NORM: tl.constexpr, PRO_ROPE: tl.constexpr,
              PRO_R: tl.constexpr, PRO_G2: tl.constexpr, INTERP: tl.constexpr):
    # the descale of one operand of one (b, h) from its partials, then e4m3 codes of rows
    # [tile*QUANT_ROWS, (tile+1)*QUANT_ROWS) into dst (B, S, H, D) contiguous
    j = tl.arange(0, NCP)
    amax = tl.max(tl.load(part_ptr + bh64 * NC + j, mask=j < NC, other=0), axis=0).to(tl.float32, bitcast=True)
    ds = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 448.0))
    if tile == 0:
        tl.store(desc_ptr + bh64, ds)
    base = src + b * s_b + h * s_h
    d = tl.arange(0, D).to(tl.int64)
    start = tile * QUANT_ROWS
    end = tl.minimum(start + QUANT_ROWS, S)
    for first in range(start, end, ROWS):
        x = _load_rows_pro(base, s_s, s_d, first, end, d, ROWS, w_ptr, cos_ptr, sin_ptr, text_rows, eps, D, PRO,
                           PRO_NORM, PRO_ROPE, PRO_R, PRO_G2, INTERP)
        y = _to_e4m3(_div_by_descale(x.to(tl.float32), ds, True), INTERP)
        rows = first + tl.arange(0, ROWS)
        off = ((b * S + rows.to(tl.int64)) * H + h)[:, None] * D + d[None, :]
        tl.store(dst + off, y, mask=(rows < end)[:, None])


@triton.jit(do_not_specialize=["text_rows"])  # as in _stats_kernel
def _quant_kernel(
    q_ptr, k_ptr, v_ptr,
    sqb, sqs, sqh, sqd,
    skb, sks, skh, skd,
    svb, svs, svh, svd,
    q8_ptr, k8_ptr, v8_ptr, part_ptr, desc_ptr, BH, S, NC, NT,
    wq_ptr, wk_ptr, cos_ptr, sin_ptr, text_rows, eps,
    H: tl.constexpr, D: tl.constexpr, NCP: tl.constexpr, QUANT_ROWS: tl.constexpr, ROWS: tl.constexpr,
    INTERP: tl.constexpr,
    PRO: tl.constexpr, PRO_NORM: tl.constexpr, PRO_ROPE: tl.constexpr, PRO_R: tl.constexpr, PRO_G2: tl.constexpr,
):
    t = tl.program_id(0)
    op = t // NT
    tile = t % NT
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    bh64 = bh.to(tl.int64)
    if op == 0:
        _quant_op(q_ptr, sqb, sqs, sqh, sqd, q8_ptr, part_ptr, desc_ptr, b, h, bh64, tile, S, NC, wq_ptr, cos_ptr,
                  sin_ptr, text_rows, eps, H, D, NCP, QUANT_ROWS, ROWS, True, PRO_NORM, PRO_ROPE, PRO_R, PRO_G2,
                  INTERP)
    elif op == 1:
        _quant_op(k_ptr, skb, sks, skh, skd, k8_ptr, part_ptr + BH * NC, desc_ptr + BH, b, h, bh64, tile, S, NC,
                  wk_ptr, cos_ptr, sin_ptr, text_rows, eps, H, D, NCP, QUANT_ROWS, ROWS, True, PRO_NORM, PRO_ROPE,
                  PRO_R, PRO_G2, INTERP)
    else:
        _quant_op(v_ptr, svb, svs, svh, svd, v8_ptr, part_ptr + 2 * BH * NC, desc_ptr + 2 * BH, b, h, bh64, tile,
                  S, NC, None, None, None, text_rows, eps, H, D, NCP, QUANT_ROWS, ROWS, False, False, 0, 0, False,
                  INTERP)


def tile_rows(D: int) -> int:
    """Rows of one [ROWS, D] tile (4096 elements: 32 fp32 registers per thread of 4 warps per tile value)."""
    return max(16, min(64, 4096 // D))


def stats_chunk_for(BH: int, S: int, device, config: Fa3PrologueConfig) -> int:
    """Rows per amax program: ``config.stats_chunk``, on a GPU halved (down to 128 rows) while the grid of 3 operands
    x chunks x B*H has fewer than ``config.stats_programs_per_sm`` programs per SM (a grid of a few waves is bound
    by each program's serial loop)."""
    chunk = config.stats_chunk
    if torch.device(device).type != "cuda" or not config.stats_programs_per_sm:
        return chunk
    return chunk_for_grid(chunk, S, BH * 3, config.stats_programs_per_sm, device)


def check_config(config: Fa3PrologueConfig) -> None:
    """One-line DitprofError unless ``config`` is a launch configuration the kernels take."""
    if not isinstance(config, Fa3PrologueConfig):
        raise DitprofError(f"config must be a Fa3PrologueConfig, got {type(config).__name__}")
    if config.stats_chunk < 16:
        raise DitprofError(f"Fa3PrologueConfig.stats_chunk must be >= 16, got {config.stats_chunk}")
    if config.quant_rows < 64 or config.quant_rows % 64:
        raise DitprofError(f"Fa3PrologueConfig.quant_rows must be a positive multiple of 64, got {config.quant_rows}")
    if config.warps < 1 or config.warps & (config.warps - 1):
        raise DitprofError(f"Fa3PrologueConfig.warps must be a power of two, got {config.warps}")


_ARGS = ("q_ptr", "k_ptr", "v_ptr")


class Fa3ProloguePlan:
    """The two launches for one call signature (see the module docstring): grids and constants fixed once."""

    def __init__(self, q, k, v, spec: PrologueSpec, groups: int, config: Fa3PrologueConfig):
        B, S, H, D = q.shape
        BH = B * H
        self.shape, self.device = (B, S, H, D), q.device
        chunk = stats_chunk_for(BH, S, q.device, config)
        self.nc = triton.cdiv(S, chunk)
        nt = triton.cdiv(S, config.quant_rows)
        strides = {}
        for pre, x in (("sq", q), ("sk", k), ("sv", v)):
            for axis, st in zip("bshd", x.stride()):
                strides[pre + axis] = st
        common = dict(strides, BH=BH, S=S, NC=self.nc, H=H, D=D, ROWS=tile_rows(D), INTERP=INTERPRET,
                      **prologue_constants(spec, D, groups))
        stats = dict(common, CHUNK=chunk, R=PrepConfig().stats_r, W=config.warps * stats_rows_per_warp(D))
        quant = dict(common, NT=nt, NCP=triton.next_power_of_2(self.nc), QUANT_ROWS=config.quant_rows)
        warps = {"num_warps": config.warps}
        self.stats = FixedLaunch(_stats_kernel, (3 * self.nc, BH), warps, stats, _ARGS + ("part_ptr",) + _PRO_ARGS)
        self.quant = FixedLaunch(_quant_kernel, (3 * nt, BH), warps, quant,
                                 _ARGS + ("q8_ptr", "k8_ptr", "v8_ptr", "part_ptr", "desc_ptr") + _PRO_ARGS)

    def launch(self, q, k, v, out: tuple, pro: tuple, stream: Optional[int]) -> None:
        """Both launches on ``stream`` (a raw CUDA stream handle; None: Triton's JIT path): ``out`` = (q8, k8, v8,
        descales (3, B, H)), ``pro`` = (wq, wk, cos, sin, text_rows) with None for what the spec does not use."""
        B, _, H, _ = self.shape
        part = torch.empty((3, B * H, self.nc), dtype=torch.int32, device=self.device)
        self.stats((q, k, v, part) + pro, stream)
        self.quant((q, k, v) + tuple(out[:3]) + (part, out[3]) + pro, stream)


_PLANS: dict = {}
_MAX_PLANS = 64


def _aligned16(t) -> bool:
    return t is None or t.data_ptr() % 16 == 0


def _plan_for(q, k, v, spec, pro, config) -> Fa3ProloguePlan:
    # what the compiled kernels are specialised on: shapes, strides, dtypes, 16-byte alignment, the constexprs
    tensors = (q, k, v) + pro[:4]
    key = (spec, config, q.device, tuple((None if t is None else (tuple(t.shape), t.stride(), t.dtype,
                                                                   _aligned16(t))) for t in tensors))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.pop(next(iter(_PLANS)))
        groups = pro[0].shape[0] if pro[0] is not None else 1
        plan = _PLANS[key] = Fa3ProloguePlan(q, k, v, spec, groups, config)
    return plan


def _check_out(out, shape, device) -> tuple:
    if not (isinstance(out, (tuple, list)) and len(out) == 4):
        raise DitprofError("out must be the tuple (q8, k8, v8, descales)")
    B, S, H, D = shape
    want = ((B, S, H, D), torch.float8_e4m3fn), ((B, S, H, D), torch.float8_e4m3fn), \
        ((B, S, H, D), torch.float8_e4m3fn), ((3, B, H), torch.float32)
    for name, t, (shp, dt) in zip(("q8", "k8", "v8", "descales"), out, want):
        # 16-byte aligned: the cached launches are compiled for the aligned buffers they allocate themselves
        if not (isinstance(t, torch.Tensor) and tuple(t.shape) == shp and t.dtype == dt and t.is_contiguous()
                and t.device == device and t.data_ptr() % 16 == 0):
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise DitprofError(f"out {name} must be a contiguous, 16-byte aligned {dt} {shp} tensor on {device}, "
                               f"got {got}")
    return tuple(out)


def fa3_prologue_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: PrologueSpec, *,
                        wq: Optional[torch.Tensor], wk: Optional[torch.Tensor], cos: Optional[torch.Tensor],
                        sin: Optional[torch.Tensor], text_rows: int = 0,
                        config: Fa3PrologueConfig = Fa3PrologueConfig(), out: Optional[tuple] = None) -> tuple:
    """FA3 FP8's inputs from raw q, k (B, S, H, D) with the prologue ``spec`` (weights ``wq``/``wk`` (G, D), G = 2:
    rows below ``text_rows`` take row 0; table ``cos``/``sin`` (S, rope_dim)) and v: (q8, k8, v8, dq, dk, dv), see
    the module docstring. ``out``: (q8, k8, v8, descales (3, B, H) float32) to write into. CUDA tensors, or CPU
    tensors under ``TRITON_INTERPRET=1``."""
    if not isinstance(spec, PrologueSpec):
        raise DitprofError(f"spec must be a PrologueSpec, got {type(spec).__name__}")
    if spec.across:
        raise DitprofError("fa3_prologue_inputs normalizes per head: norm='rms_across' (across heads) is not built "
                           "here")
    check_config(config)
    qs, ks, vs = check_qkv(q, k, v, who="fa3_prologue_inputs", pow2_head_dim=True)
    check_prologue_call(spec, qs, ks, wq, wk, cos, sin, text_rows)
    wq, wk, cos, sin, text_rows = prologue_tensors(spec, wq, wk, cos, sin, text_rows)
    if spec.norm is None:
        wq = wk = None
    pro = (wq, wk, cos, sin, text_rows)
    B, S, H, D = qs.shape
    if out is not None:
        out = _check_out(out, (B, S, H, D), qs.device)
    if qs.device.type != "cuda" and not INTERPRET:
        raise DitprofError(f"fa3_prologue_inputs needs CUDA tensors (got {qs.device}); set TRITON_INTERPRET=1 to "
                           f"interpret on CPU")
    if out is None:
        out = tuple(torch.empty((B, S, H, D), dtype=torch.float8_e4m3fn, device=qs.device) for _ in range(3)) + \
            (torch.empty((3, B, H), dtype=torch.float32, device=qs.device),)
    plan = _plan_for(qs, ks, vs, spec, pro, config)
    if qs.device.type == "cuda":
        with torch.cuda.device(qs.device):
            plan.launch(qs, ks, vs, out, pro, torch.cuda.current_stream().cuda_stream)
    else:
        plan.launch(qs, ks, vs, out, pro, None)
    desc = out[3]
    return out[0], out[1], out[2], desc[0], desc[1], desc[2]


def compile_offline(arch: int = 90, *, dtype: str = "bf16", head_dim: int = 128, spec: PrologueSpec = PrologueSpec(),
                    groups: int = 1, config: Fa3PrologueConfig = Fa3PrologueConfig()) -> dict:
    """Compile both kernels for ``sm_<arch>`` without a GPU (triton.compile + the wheel's ptxas) with a real
    launch's specialisations (16-divisible pointers and b/s/h strides, unit feature stride), for tests and inspection
    (spills, vector loads, the e4m3 cvt). Returns {"stats": CompiledKernel, "quant": CompiledKernel}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    check_config(config)
    elem = {"bf16": "*bf16", "fp16": "*fp16"}[dtype]
    types = {"q_ptr": elem, "k_ptr": elem, "v_ptr": elem, "wq_ptr": elem, "wk_ptr": elem, "cos_ptr": "*fp32",
             "sin_ptr": "*fp32", "part_ptr": "*i32", "desc_ptr": "*fp32", "q8_ptr": "*fp8e4nv", "k8_ptr": "*fp8e4nv",
             "v8_ptr": "*fp8e4nv", "eps": "fp32"}
    div16 = {p + a for p in ("sq", "sk", "sv") for a in "bsh"}
    D = head_dim
    pro = prologue_constants(spec, D, groups)
    del pro["eps"]  # a runtime fp32 argument, as in the plan's launches
    common = dict(H=8, D=D, ROWS=tile_rows(D), INTERP=False, **pro)
    consts = {"stats": dict(common, CHUNK=config.stats_chunk, R=PrepConfig().stats_r,
                            W=config.warps * stats_rows_per_warp(D)),
              "quant": dict(common, NCP=32, QUANT_ROWS=config.quant_rows)}
    for name, t in (("wq_ptr", spec.norm), ("wk_ptr", spec.norm), ("cos_ptr", spec.rope), ("sin_ptr", spec.rope)):
        if t is None:
            for c in consts.values():
                c[name] = None
    out = {}
    for name, fn in (("stats", _stats_kernel), ("quant", _quant_kernel)):
        sig, constexprs, attrs = {}, dict(consts[name]), {}
        for i, arg in enumerate(fn.arg_names):
            if arg in constexprs or arg in ("sqd", "skd", "svd"):
                sig[arg] = "constexpr"
                constexprs.setdefault(arg, 1)
                continue
            sig[arg] = types.get(arg, "i32")
            if arg.endswith("_ptr") or arg in div16:
                attrs[(i,)] = [["tt.divisibility", 16]]
        src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
        out[name] = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                   options={"num_warps": config.warps, "enable_fp_fusion": True})
    return out


__all__ = ["Fa3ProloguePlan", "check_config", "compile_offline", "fa3_prologue_inputs", "stats_chunk_for", "tile_rows"]
