"""Attention benchmark: our FP8 kernel (incl. prep), the prep alone, and peers, in one process, one table + JSON.

    python benchmarks/attention.py                     # H3 shape (1, 56, 30272, 128), non-causal
    python benchmarks/attention.py --shapes h3,wan14b  # + Wan 2.x 14B (1, 40, 75600, 128)
    python benchmarks/attention.py --shapes flux,ltx,cogvideox,wan1.3b,hunyuan   # the other DiT shapes
    python benchmarks/attention.py --only fa3-bf16,fa3-fp8,fa3-fp8+quant,fp8     # FlashAttention-3 vs ours
    python benchmarks/attention.py --quick             # small shape, a smoke run
    python benchmarks/attention.py --shapes 2,24,4096,128,512   # B,H,Sq,D[,Sk]

Each entry: warm-up, then the median of N runs timed with CUDA events. TFLOP/s use 4*B*H*Sq*Sk*D.
A backend that is missing or fails is recorded with its reason; the run goes on. Results go to
``benchmarks/results/attention-<date>.json`` (``--json PATH`` to choose, ``--no-json`` for none).
Entries that could leave a sticky CUDA error (our kernels) run last so that a crash cannot void the peers.

FlashAttention-3 (the forward-only ``fa3_fwd`` wheel, ``from fa3_fwd_interface import flash_attn_func``):
``fa3-bf16`` on the bf16/fp16 inputs; ``fa3-fp8`` on e4m3 inputs quantized per (batch, head) before the timing
(descale = amax/448 over (S, D), passed as float32 (B, H) q/k/v_descale), kernel only; ``fa3-fp8+quant`` the
same with that quantization (torch ops, ``quantize_per_head``) inside the timed region.

The attention's prologue (issue: quantize Q/K where they are made): the ``+norm-rope`` entries start from the raw
projections and run the processor's per-head RMSNorm and RoPE as the model does (torch ops, diffusers' RoPE
functions) before the attention -- what a block spends today; ``fp8+prologue`` runs them inside our FP8 prep
(``kernels.op.fp8_attention_prologue``). The fair pair of issue 43: ``fa3-fp8+prologue`` is FA3 FP8 fed by the same
fused prologue (``kernels.fa3_prologue.fa3_prologue_inputs``: norm + RoPE + per-(batch, head) e4m3 quantization,
two Triton launches, timed with the kernel), ``fa3-prologue-prep`` that prep alone (so the table shows prep vs
kernel). The RoPE form follows the shape's family (``ROPE_FORMS``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Skip, cuda_ready, environment, print_table, results_path, run_entry, write_json  # noqa: E402

SHAPES = {
    "h3": dict(B=1, H=56, Sq=30272, Sk=30272, D=128),  # HunyuanVideo-class, 720p video tokens
    "wan14b": dict(B=1, H=40, Sq=75600, Sk=75600, D=128),  # Wan 2.x 14B, 720p 81 frames
    "flux": dict(B=1, H=24, Sq=4608, Sk=4608, D=128),  # FLUX.1, 1024x1024 image + 512 text tokens
    "ltx": dict(B=1, H=32, Sq=7392, Sk=7392, D=64),  # LTX-Video
    "cogvideox": dict(B=1, H=48, Sq=17776, Sk=17776, D=64),  # CogVideoX
    "wan1.3b": dict(B=1, H=12, Sq=32760, Sk=32760, D=128),  # Wan 2.x 1.3B, 480p 81 frames
    "hunyuan": dict(B=1, H=24, Sq=119056, Sk=119056, D=128),  # HunyuanVideo, 720p 129 frames
    "quick": dict(B=1, H=8, Sq=4096, Sk=4096, D=128),
}

# the RoPE form of each shape's family (diffusers: Flux / LTX pairs interleaved, MiniMax-H3 / HunyuanVideo halves)
ROPE_FORMS = {"flux": "interleaved", "ltx": "interleaved", "cogvideox": "half", "h3": "half", "wan14b": "interleaved",
              "wan1.3b": "interleaved", "hunyuan": "interleaved"}

ALL_ENTRIES = [
    "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "fa4", "fa3-bf16", "fa3-fp8", "fa3-fp8+quant", "sage",
    "cudnn-fp8", "sdpa-cudnn+norm-rope", "fa3-fp8+norm-rope+quant",
    "prep-torch", "prep-triton", "prep-triton-int8", "fa3-prologue-prep", "fa3-fp8+prologue",
    "fa3-fp8+prologue-graph",
    "fp8", "fp8-sm90", "fp8-sm120", "fp8-e4m3", "fp8-int8",
    "fp8+norm-rope", "fp8+prologue",
]


def prologue_inputs(q, form, rope_dim: int = 0):
    """Per-head RMSNorm weights (1, D) of q's dtype and an (S, R) fp32 RoPE table of random angles in ``form``
    ("interleaved" or "half") over R = ``rope_dim`` channels (0: all D), fresh and seeded, as a processor would
    hand them to the fused prologue."""
    import torch

    B, S, H, D = q.shape
    g = torch.Generator(device=q.device).manual_seed(1)
    wq, wk = (torch.rand((1, D), device=q.device, generator=g).to(q.dtype) + 0.5 for _ in range(2))
    ang = torch.rand((S, (rope_dim or D) // 2), device=q.device, generator=g) * 6.0
    if form == "interleaved":
        cos, sin = torch.cos(ang).repeat_interleave(2, -1), torch.sin(ang).repeat_interleave(2, -1)
    else:
        cos, sin = torch.cos(ang).repeat(1, 2), torch.sin(ang).repeat(1, 2)
    return wq, wk, cos, sin


def make_prologue_entries(q, k, v, scale, form):
    """The ``+norm-rope`` / ``+prologue`` entries: q and k are the raw projections; per-head RMSNorm weights and
    a RoPE table of random angles (fresh, not zeros) as the processor would have them."""
    import torch
    import torch.nn.functional as F

    B, S, H, D = q.shape
    wq, wk, cos, sin = prologue_inputs(q, form)

    def norm_rope(x, w):
        from diffusers.models.embeddings import apply_rotary_emb
        from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

        x = F.rms_norm(x, (D,), w[0], 1e-6)
        return apply_rotary_emb(x, (cos, sin), sequence_dim=1) if form == "interleaved" else \
            _apply_rotary_emb(x, cos, sin)

    def unfused(attend):
        def make():
            def fn():
                return attend(norm_rope(q, wq), norm_rope(k, wk), v)

            fn()
            return fn

        return make

    def cudnn(qq, kk, vv):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (qq, kk, vv)), scale=scale)

    def fa3_quant(qq, kk, vv):
        flash_attn_func = _fa3_func(q, "fp8")
        (q8, dq), (k8, dk), (v8, dv) = (quantize_per_head(x) for x in (qq, kk, vv))
        return flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=False, q_descale=dq, k_descale=dk,
                               v_descale=dv)

    def ours(qq, kk, vv):
        from ditprof.kernels.interface import fp8_attention

        return fp8_attention(qq, kk, vv, layout="BSHD", scale=scale)

    def fa3_fused(prep_only, graph=False):
        def make():
            try:
                from ditprof.kernels.fa3_prologue import fa3_prologue_inputs
                from ditprof.kernels.prep import triton_available
                from ditprof.kernels.prologue import PrologueSpec
            except Exception as exc:
                raise Skip(f"ditprof.kernels.fa3_prologue not importable ({type(exc).__name__}: {exc})")
            ok, why = triton_available(q.device)
            if not ok:
                raise Skip(why)
            flash_attn_func = None if prep_only else _fa3_func(q, "fp8")
            spec = PrologueSpec("rms", 1e-6, form, D)

            def prep():
                return fa3_prologue_inputs(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin)

            def fn():
                q8, k8, v8, dq, dk, dv = prep()
                return flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=False, q_descale=dq, k_descale=dk,
                                       v_descale=dv)

            run = prep if prep_only else fn
            run()  # compiles (cached afterwards)
            return _graph_replay(run) if graph else run

        return make

    def fused():
        from ditprof.kernels.op import fp8_attention_prologue
        from ditprof.kernels.prologue import PrologueSpec

        spec = PrologueSpec("rms", 1e-6, form, D)

        def fn():
            return fp8_attention_prologue(q, k, v, spec, wq=wq, wk=wk, cos=cos, sin=sin, scale=scale)

        fn()
        return fn

    return {
        "sdpa-cudnn+norm-rope": (unfused(cudnn), "attention", f"norm + RoPE ({form}, torch ops) + SDPA cuDNN bf16"),
        "fa3-fp8+norm-rope+quant": (unfused(fa3_quant), "attention", f"norm + RoPE ({form}) + per-head "
                                                                       f"quantization (torch ops) + FA3 FP8"),
        "fp8+norm-rope": (unfused(ours), "attention", f"norm + RoPE ({form}, torch ops) + ditprof fp8 (its prep "
                                                       f"included): the unfused block path"),
        "fa3-prologue-prep": (fa3_fused(True), "prep", f"FA3 FP8's inputs from the raw projections: norm + RoPE "
                                                        f"({form}) + per-head e4m3 quantization fused (Triton, "
                                                        f"2 launches), prep only"),
        "fa3-fp8+prologue": (fa3_fused(False), "attention", f"FA3 FP8 fed by the fused prologue: norm + RoPE "
                                                             f"({form}) + per-head e4m3 quantization (Triton) + "
                                                             f"FA3 FP8, both timed"),
        "fa3-fp8+prologue-graph": (fa3_fused(False, graph=True), "attention", f"fa3-fp8+prologue ({form}) "
                                                                             f"captured once and replayed as one "
                                                                             f"CUDA graph, as fp8+prologue replays "
                                                                             f"its launches"),
        "fp8+prologue": (fused, "attention", f"ditprof fp8 from the raw projections: norm + RoPE ({form}) fused "
                                             f"into its prep (a repeated call replays its launches as one CUDA "
                                             f"graph)"),
    }


def _graph_replay(fn):
    """``fn`` captured once in a CUDA graph (after the warm-up call that compiled it); the returned callable replays
    it: no host time per launch, as our op's repeated calls (``Fp8Options.graphs``)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # a warm-up on the capture's stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def parse_shape(text: str) -> tuple[str, dict]:
    text = text.strip()
    if text in SHAPES:
        return text, dict(SHAPES[text])
    parts = [int(x) for x in text.split(",")]
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(f"shape {text!r}: a name ({', '.join(SHAPES)}) or B,H,Sq,D[,Sk]")
    B, H, Sq, D = parts[:4]
    Sk = parts[4] if len(parts) == 5 else Sq
    return text, dict(B=B, H=H, Sq=Sq, Sk=Sk, D=D)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="h3", help=f"comma list of {', '.join(SHAPES)}; or one B,H,Sq,D[,Sk] "
                   "(several custom shapes: separate with ';')")
    p.add_argument("--quick", action="store_true", help="small shape (1,8,4096,128), 2 warm-up, 5 timed runs")
    p.add_argument("--iters", type=int, default=None, help="timed runs per entry (default 10; quick 5)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up runs per entry (default 3; quick 2)")
    p.add_argument("--only", default=None, help=f"comma list of entries to run, from: {', '.join(ALL_ENTRIES)}")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"], help="input dtype of q, k, v")
    p.add_argument("--json", dest="json_path", default=None, help="output JSON path")
    p.add_argument("--no-json", action="store_true", help="write no JSON")
    return p


def split_shapes(text: str) -> list[str]:
    if ";" in text:
        return [s for s in text.split(";") if s.strip()]
    items = text.split(",")
    if all(i.strip() in SHAPES for i in items):
        return items
    return [text]  # a single custom B,H,Sq,D[,Sk]


# ---------------------------------------------------------------------------------------------- entries

E4M3_MAX = 448.0


def quantize_per_head(x):
    """x (B, S, H, D) -> (x8 float8_e4m3fn (B, S, H, D), descale float32 (B, H)), the FA3 FP8 input format.

    descale = amax over (S, D) of each (batch, head) / 448 (1 where that amax is 0), x8 = (x / descale) in e4m3,
    so x8 * descale ~ x. Pure torch: runs on CPU (tests) and, inside the ``fa3-fp8+quant`` timing, on the GPU.
    """
    import torch

    amax = x.abs().amax(dim=(1, 3)).float()  # (B, H); abs/max are exact in the input dtype
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    x8 = (x / descale[:, None, :, None]).to(torch.float8_e4m3fn)  # the division promotes to float32
    return x8, descale


def _fa3_func(q, dtype_name):
    """FA3's flash_attn_func, or Skip with the reason (not installed, GPU or dtype it cannot run)."""
    import torch

    try:
        from fa3_fwd_interface import flash_attn_func
    except Exception as exc:
        raise Skip(f"fa3_fwd not installed (GPU bundle part3 wheel fa3_fwd; {type(exc).__name__}: {exc})")
    if q.is_cuda:
        major, minor = torch.cuda.get_device_capability(q.device)
        # the wheel's arch >= 90 path is sm_90a code (Hopper only); FP8 is not in its sm_8x path
        if dtype_name == "fp8" and major != 9:
            raise Skip(f"FA3 FP8 runs on Hopper (sm_90) only (got sm_{major}{minor})")
        if major not in (8, 9):
            raise Skip(f"fa3_fwd kernels are built for sm_8x/sm_90a (got sm_{major}{minor})")
    try:
        from fa3_fwd_config import CONFIG

        flags = CONFIG.get("build_flags", {})
    except Exception:  # noqa: BLE001 - no build record: let the call say what it cannot do
        flags = {}
    if dtype_name == "fp16" and flags.get("FLASHATTENTION_DISABLE_FP16"):
        raise Skip("fa3_fwd built without FP16 kernels (FLASHATTENTION_DISABLE_FP16); use --dtype bf16")
    if dtype_name == "fp8" and flags.get("FLASHATTENTION_DISABLE_FP8"):
        raise Skip("fa3_fwd built without FP8 kernels (FLASHATTENTION_DISABLE_FP8)")
    return flash_attn_func


def make_entries(q, k, v, scale):
    """name -> (factory returning a zero-arg callable, kind, note). q, k, v are (B, S, H, D) contiguous."""
    import torch
    import torch.nn.functional as F

    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # (B, H, S, D) for torch SDPA

    def sdpa(backend_name):
        def make():
            from torch.nn.attention import SDPBackend, sdpa_kernel

            backend = getattr(SDPBackend, backend_name)

            def fn():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qh, kh, vh, scale=scale)

            fn()  # raises when this backend cannot take the inputs
            return fn

        return make

    def fa4():
        try:
            from flash_attn.cute import flash_attn_func
        except Exception as exc:
            raise Skip(f"flash_attn.cute not importable ({type(exc).__name__}: {exc})")

        def fn():
            return flash_attn_func(q, k, v, softmax_scale=scale, causal=False)

        fn()
        return fn

    def sage():
        try:
            from sageattention import sageattn
        except Exception as exc:
            raise Skip(f"sageattention not importable ({type(exc).__name__}: {exc})")

        def fn():
            return sageattn(q, k, v, tensor_layout="NHD", is_causal=False, sm_scale=scale)

        fn()
        return fn

    def fa3_bf16():
        flash_attn_func = _fa3_func(q, "fp16" if q.dtype == torch.float16 else "bf16")

        def fn():
            return flash_attn_func(q, k, v, softmax_scale=scale, causal=False)  # returns out only

        fn()
        return fn

    def fa3_fp8(quant_in_timing):
        def make():
            flash_attn_func = _fa3_func(q, "fp8")
            if quant_in_timing:
                def fn():
                    (q8, dq), (k8, dk), (v8, dv) = (quantize_per_head(x) for x in (q, k, v))
                    return flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=False,
                                           q_descale=dq, k_descale=dk, v_descale=dv)
            else:
                (q8, dq), (k8, dk), (v8, dv) = (quantize_per_head(x) for x in (q, k, v))  # once, untimed

                def fn():
                    return flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=False,
                                           q_descale=dq, k_descale=dk, v_descale=dv)

            fn()
            return fn

        return make

    def cudnn_fp8():
        return make_cudnn_fp8(q, k, v, scale)

    def prep_torch():
        from ditprof.kernels.prep import fp8_prepare_torch

        return lambda: fp8_prepare_torch(q, k, v)

    def prep_triton():
        from ditprof.kernels.prep import fp8_prepare, triton_available

        ok, why = triton_available(q.device)
        if not ok:
            raise Skip(why)
        return lambda: fp8_prepare(q, k, v, backend="triton")

    def prep_triton_int8():
        from ditprof.kernels.prep import fp8_prepare, triton_available

        ok, why = triton_available(q.device)
        if not ok:
            raise Skip(why)
        return lambda: fp8_prepare(q, k, v, backend="triton", qk_int8=True)

    def ours_format(fmt):
        def make():
            from ditprof.kernels.interface import Fp8Options, fp8_attention

            opts = Fp8Options(qk_format=fmt)

            def fn():
                return fp8_attention(q, k, v, layout="BSHD", scale=scale, options=opts)

            fn()
            return fn

        return make

    def ours(kernel=None):
        def make():
            try:
                from ditprof.kernels.interface import (Fp8Options, arch_for_capability, fp8_attention,
                                                       kernel_name_for_arch)
            except Exception as exc:
                raise Skip(f"ditprof.kernels.interface.fp8_attention not importable ({type(exc).__name__}: {exc})")
            try:
                kernel_name_for_arch(arch_for_capability(torch.cuda.get_device_capability(q.device)), kernel)
            except Exception as exc:
                raise Skip(str(exc))

            opts = Fp8Options(kernel=kernel or "auto")

            def fn():
                return fp8_attention(q, k, v, layout="BSHD", scale=scale, options=opts)

            fn()  # compiles (cached afterwards)
            return fn

        return make

    return {
        "sdpa-cudnn": (sdpa("CUDNN_ATTENTION"), "attention", "torch SDPA, cuDNN backend, bf16"),
        "sdpa-flash": (sdpa("FLASH_ATTENTION"), "attention", "torch SDPA, flash backend (FA2), bf16"),
        "sdpa-efficient": (sdpa("EFFICIENT_ATTENTION"), "attention", "torch SDPA, mem-efficient backend, bf16"),
        "fa4": (fa4, "attention", "flash_attn.cute.flash_attn_func, bf16"),
        "fa3-bf16": (fa3_bf16, "attention", "FlashAttention-3 (fa3_fwd_interface.flash_attn_func), bf16/fp16"),
        "fa3-fp8": (fa3_fp8(False), "attention", "FlashAttention-3 FP8 e4m3, per-(batch, head) descales; inputs "
                                                 "pre-quantized, kernel only"),
        "fa3-fp8+quant": (fa3_fp8(True), "attention", "FlashAttention-3 FP8 e4m3 with the per-(batch, head) "
                                                       "quantization of q, k, v (torch ops) in the timing"),
        "sage": (sage, "attention", "sageattention.sageattn (its own quantization included)"),
        "cudnn-fp8": (cudnn_fp8, "attention", "cuDNN FP8 SDPA via cudnn frontend; inputs pre-quantized, "
                                                "kernel only"),
        "prep-torch": (prep_torch, "prep", "fp8_prepare_torch: naive chain of torch ops"),
        "prep-triton": (prep_triton, "prep", "fp8_prepare: fused Triton prep (3 launches + 1 D2H check)"),
        "fp8": (ours(), "attention", "ditprof fp8_attention (kernel picked by arch), prep included"),
        "fp8-sm90": (ours("fp8-sm90"), "attention", "ditprof wgmma kernel (sm_90a), prep included"),
        "fp8-sm120": (ours("fp8-sm120"), "attention", "ditprof mma.sync kernel (native on sm_89/sm_120, "
                                                       "emulated on sm_90), prep included"),
        "prep-triton-int8": (prep_triton_int8, "prep", "fp8_prepare(qk_int8=True): rotated INT8 Q/K prep"),
        "fp8-e4m3": (ours_format("e4m3"), "attention", "ditprof kernel by arch, e4m3 Q/K "
                                                       "(Fp8Options(qk_format='e4m3')), prep included"),
        "fp8-int8": (ours_format("int8"), "attention", "ditprof kernel by arch, rotated INT8 Q/K "
                                                       "(Fp8Options(qk_format='int8')), prep included"),
    }


def make_cudnn_fp8(q, k, v, scale):
    """An FP8 (e4m3) SDPA graph through the cudnn frontend; output bf16, else fp8 (Hopper needs fp8 O)."""
    import torch

    try:
        import cudnn
    except Exception as exc:
        raise Skip(f"cudnn frontend not importable ({type(exc).__name__}: {exc})")
    B, S, H, D = q.shape
    Sk = k.shape[1]
    f8 = torch.float8_e4m3fn
    # inputs quantized once outside the timing (unit descales: the values are ~N(0,1), inside e4m3 range)
    q8, k8, v8 = (x.clamp(-448, 448).to(f8) for x in (q, k, v))
    dims_q, strides_q = (B, H, S, D), (S * H * D, D, H * D, 1)
    dims_k, strides_k = (B, H, Sk, D), (Sk * H * D, D, H * D, 1)
    one = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=q.device)
    amax_s = torch.zeros_like(one)
    amax_o = torch.zeros_like(one)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    errors = []
    for out_dtype, out_torch in ((cudnn.data_type.BFLOAT16, torch.bfloat16), (cudnn.data_type.FP8_E4M3, f8)):
        try:
            e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
            g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                              handle=handle)
            tq = g.tensor(name="q", dim=dims_q, stride=strides_q, data_type=e4m3)
            tk = g.tensor(name="k", dim=dims_k, stride=strides_k, data_type=e4m3)
            tv = g.tensor(name="v", dim=dims_k, stride=strides_k, data_type=e4m3)
            scal = dict(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
            sc = [g.tensor(name=n, **scal) for n in ("descale_q", "descale_k", "descale_v", "descale_s",
                                                      "scale_s", "scale_o")]
            kw = dict(q=tq, k=tk, v=tv, descale_q=sc[0], descale_k=sc[1], descale_v=sc[2], descale_s=sc[3],
                      scale_s=sc[4], scale_o=sc[5], attn_scale=scale, use_causal_mask=False, name="sdpa_fp8")
            try:
                to, _, tas, tao = g.sdpa_fp8(**kw, is_inference=True)
            except TypeError:  # newer frontends: generate_stats replaces is_inference
                to, _, tas, tao = g.sdpa_fp8(**kw, generate_stats=False)
            to.set_output(True).set_dim(dims_q).set_stride(strides_q).set_data_type(out_dtype)
            for t in (tas, tao):
                t.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
            o = torch.empty((B, S, H, D), dtype=out_torch, device=q.device)
            ws = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=q.device)
            pack = {tq: q8, tk: k8, tv: v8, to: o, tas: amax_s, tao: amax_o}
            for t in sc:
                pack[t] = one

            def fn(g=g, pack=pack, ws=ws):
                g.execute(pack, ws, handle=handle)
                return pack

            fn()
            torch.cuda.synchronize()
            return fn
        except Exception as exc:
            errors.append(f"out {out_torch}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    raise RuntimeError("cuDNN FP8 SDPA graph failed: " + " | ".join(errors))


# ---------------------------------------------------------------------------------------------- main


def bench_shape(label, shp, args, only):
    import torch

    B, H, Sq, Sk, D = shp["B"], shp["H"], shp["Sq"], shp["Sk"], shp["D"]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    flops = 4.0 * B * H * Sq * Sk * D
    scale = 1.0 / math.sqrt(D)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((B, Sq, H, D), device="cuda", dtype=dtype, generator=g)
    k = torch.randn((B, Sk, H, D), device="cuda", dtype=dtype, generator=g)
    v = torch.randn((B, Sk, H, D), device="cuda", dtype=dtype, generator=g)
    el = q.element_size()
    prep_bytes = (B * H * D) * ((Sq + 2 * Sk) * el * 2 + (Sq + 2 * Sk))  # read Q,K,V twice + write fp8 once
    entries = make_entries(q, k, v, scale)
    entries.update(make_prologue_entries(q, k, v, scale, ROPE_FORMS.get(label, "half")))
    order = [n for n in ALL_ENTRIES if n in only]
    records = []
    for name in order:
        make, kind, note = entries[name]
        print(f"  {label}: {name} ...", flush=True)
        rec = run_entry(
            name, make,
            flops=flops if kind == "attention" else None,
            nbytes=prep_bytes if kind == "prep" else None,
            warmup=args.warmup, iters=args.iters, note=note,
        )
        rec["kind"] = kind
        records.append(rec)
        if rec["status"] != "ok":
            print(f"    {rec['status']}: {rec.get('error', '')[:300]}", flush=True)
    del q, k, v, entries
    torch.cuda.empty_cache()
    return {"shape": label, **shp, "dtype": args.dtype, "causal": False, "flops": flops,
            "prep_min_bytes": prep_bytes, "entries": records}


def _sm90_config() -> dict | None:
    """The fp8-sm90 kernel's shipped configuration (head_dim 128), recorded in the JSON."""
    try:
        from dataclasses import asdict

        from ditprof.kernels.fp8_fwd_sm90 import config_for
    except Exception:  # noqa: BLE001 - no cutlass here: nothing to record
        return None
    return asdict(config_for("sm_90a", 128))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.shapes = "quick"
    args.iters = args.iters or (5 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    only = ALL_ENTRIES if not args.only else [s.strip() for s in args.only.split(",")]
    unknown = [n for n in only if n not in ALL_ENTRIES]
    if unknown:
        print(f"error: unknown entries {unknown}; known: {', '.join(ALL_ENTRIES)}", file=sys.stderr)
        return 2
    try:
        shapes = [parse_shape(s) for s in split_shapes(args.shapes)]
    except (ValueError, argparse.ArgumentTypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ok, why = cuda_ready()
    if not ok:
        print(f"benchmarks/attention.py: {why}; nothing to measure on this machine.", file=sys.stderr)
        return 1

    env = environment()
    print(f"{env['gpu']} ({env['gpu_capability']}), torch {env['torch']}, CUDA {env['cuda_runtime']}, "
          f"cuDNN {env['cudnn']}, cutlass-dsl {env['cutlass_dsl']}, triton {env['triton']}", flush=True)
    results = [bench_shape(label, shp, args, only) for label, shp in shapes]

    for res in results:
        title = (f"attention {res['shape']}: B={res['B']} H={res['H']} Sq={res['Sq']} Sk={res['Sk']} "
                 f"D={res['D']} {res['dtype']} non-causal — {env['gpu']} — median of {args.iters}")
        rows = []
        for r in res["entries"]:
            rows.append([
                r["name"], r["status"], r.get("ms"), r.get("tflops"), r.get("gbps"),
                r.get("note") if r["status"] == "ok" else (r.get("error") or "")[:160],
            ])
        print_table(title, ["entry", "status", "ms", "TFLOP/s", "GB/s", "note / error"], rows)

    payload = {
        "benchmark": "attention",
        "env": env,
        "config": {"sm90_config": _sm90_config(),
                   "iters": args.iters, "warmup": args.warmup, "shapes": [s for s, _ in shapes],
                   "entries": only, "flops_formula": "4*B*H*Sq*Sk*D",
                   "prep_bytes_formula": "B*H*D*((Sq+2Sk)*2*elem + (Sq+2Sk))"},
        "results": results,
    }
    if not args.no_json:
        path = Path(args.json_path) if args.json_path else results_path("attention")
        write_json(payload, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
