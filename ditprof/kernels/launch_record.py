"""The FP8 attention's one launch path on CUDA: a launch record per call configuration.

``Fp8Launch`` (the launch record) is built once per (device, shapes, strides, dtypes, alignment, key lengths, LSE
wanted, options) by ``record_for``: the launch choice (``launch_choice.choose_launch``: kernel, Q/K format, grid,
Q in the kernel), the prep plan (``PrepPlan``, whose launches skip Triton's per-call argument specialisation), the
compiled kernel, the arguments that do not change and, for problems up to ``WORKSPACE_REUSE_BYTES``, the prep's
workspace (one per stream: work on one stream is ordered, so the next call's prep writes it only after this call's
kernel has read it; under CUDA-graph capture each call allocates its own). A call is then the prep's launches (two;
three with INT8 Q/K), the kernel launch (and, on the stream-K grid, its merge) and the output allocation: no sync,
no other allocation, no per-call argument checks (``record_for`` checks once per configuration). A call whose
arguments repeat an earlier one's replays those launches as one CUDA graph (``launch_graphs``; reused workspaces
only, ``Fp8Options.graphs=False`` turns it off). The stream-K tail's pieces live in the workspace (``o_part``,
``lse_part``). The NaN/Inf checks of q, k, v read the prep's sticky flags through ``finite_checks``.

``fp8_call`` is the call the front door (``interface.fp8_attention``) and the op (``op.py``) make: BSHD or BHSD,
with or without the LSE, on this one record.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.compile_cache import DTYPE_NAMES, compiled
from ditprof.kernels.compile_cache import clear as clear_compiled
from ditprof.kernels.finite_checks import CHECK_EVERY, UNCHECKED, Ring, drain, pending_queue
from ditprof.kernels.fp8_config import Fp8Options, default_options
from ditprof.kernels.kernel_args import launch_kernel
from ditprof.kernels.launch_choice import LaunchChoice, arch_of, check_options, choose_launch, q_in_kernel_ok
from ditprof.kernels.launch_graphs import LaunchGraphs, capture_graph, side_stream
from ditprof.kernels.prologue import norm_groups
from ditprof.kernels import self_check as _self_check

WORKSPACE_REUSE_BYTES = 64 << 20  # larger problems allocate per call: small against their kernel time


_STREAMS: dict = {}


def _current_stream(device_index: int) -> tuple[int, torch.cuda.Stream]:
    """(raw handle, torch.cuda.Stream) of the current stream; the object is built once per handle (the handle
    alone is what inductor's launchers read)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    raw = get(device_index) if get is not None else torch.cuda.current_stream(device_index).cuda_stream
    obj = _STREAMS.get(raw)
    if obj is None or obj.cuda_stream != raw:
        obj = _STREAMS[raw] = torch.cuda.current_stream(device_index)
    return raw, obj


def branch_stream(device) -> torch.cuda.Stream:
    """The side stream of ``device`` that preps branch onto (``Fp8Launch._launch_all``)."""
    return side_stream(device, "branch")


_ROTATIONS_T: dict = {}


def rotation_t(D: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Rpm1^T (D, D) contiguous in ``dtype`` on ``device`` (the q_rot kernel's rotation wgmma takes its B operand
    K-major), made once per (D, dtype, device) and shared read-only."""
    key = (D, dtype, torch.device(device))
    r = _ROTATIONS_T.get(key)
    if r is None:
        from ditprof.kernels.rotation import rotation_pm1

        r = _ROTATIONS_T[key] = rotation_pm1(D, torch.float64).t().contiguous().to(dtype=dtype, device=device)
    return r


def streamk_workspace(plan: tuple, D: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The tail's pieces for ``plan``: O (2 T, 192, D) in ``dtype`` and the LSE (2 T, 192) float32."""
    from ditprof.kernels.streamk_schedule import TILE_M

    slots = 2 * plan[2]
    return (torch.empty((slots, TILE_M, D), dtype=dtype, device=device),
            torch.empty((slots, TILE_M), dtype=torch.float32, device=device))


class Fp8Launch:
    """Everything one call configuration needs, computed once (see the module docstring). ``return_lse``: calls
    return (o, lse) with the LSE (B, H, Sq) float32 of the original scores (the smoothing shift added back)."""

    # fp8-sm120's self-check (``kernels.self_check``): None (a kernel without one), "passed", "failed" (``fallback``
    # says what runs instead), "off" or "not run" (the record was first made inside a CUDA graph capture)
    self_check: Optional[str] = None
    fallback: Optional[str] = None  # None, or "pv_mma f32: <why>" (the P V form that passed its check)

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, choice: LaunchChoice,
                 options: Fp8Options, return_lse: bool = False, prologue=None, pro_groups: int = 1):
        from ditprof.kernels.prep_triton import PrepPlan

        B, Sq, H, D = q.shape
        Sk = k.shape[1]
        self.device = q.device
        self.device_index = q.device.index
        self.B, self.Sq, self.Sk, self.H = B, Sq, Sk, H
        self.out_shape = (B, Sq, H, D)
        self.dtype = q.dtype
        self.spec = choice.spec
        self.streamk = choice.streamk  # the stream-K plan, None on the plain grid
        self.q_rot = self.spec.q_rot  # Q rotated and quantized in the kernel: the prep skips Q
        self.return_lse = bool(return_lse)
        self.smooth_k = options.smooth_k
        self.rot = rotation_t(D, q.dtype, q.device) if self.q_rot else None  # made now: never inside a capture
        # the descales over each item's own keys
        # prologue (kernels.prologue.PrologueSpec): q and k are raw projections, the processor's norm and RoPE run
        # in the prep's loads (the launch choice keeps Q in the prep for it)
        self.plan = PrepPlan(q, k, v, options.smooth_k, key_lens=self.spec.key_lens, qk_int8=self.spec.qk_int8,
                             skip_q=self.q_rot, config=options.prep, prologue=prologue, pro_groups=pro_groups)
        self.sq_pad, self.sk_pad = self.plan.Sq_pad, self.plan.Sk_pad
        self.merge = None
        with torch.cuda.device(self.device):
            if self.streamk is not None:
                from ditprof.kernels.streamk_merge import MergeLaunch

                n_full, n_tail, n_ctas_tail, n_kt = self.streamk
                self.merge = MergeLaunch(n_full, n_tail, n_ctas_tail, n_kt, H, Sq, D, self.device,
                                         write_lse=self.return_lse)
            self.fn = compiled(self.spec)
        bufs = self.plan.buffers("meta")
        self.lse_in_workspace = self.spec.write_lse and not self.return_lse  # a returned LSE is made per call
        lse_bytes = B * H * Sq * 4 if self.lse_in_workspace else 0
        ws_bytes = sum(t.numel() * t.element_size() for t in bufs.values()) + lse_bytes
        self.reuse = ws_bytes <= WORKSPACE_REUSE_BYTES
        self._workspaces: dict = {}
        self.ring = Ring()
        self.sizes = (B, H, Sq, Sk, self.sq_pad, self.sk_pad)
        self.calls = 0  # calls made through this record (``launch_summaries``)
        # repeated calls replayed as one CUDA graph (reused workspaces only: their addresses are the record's)
        self.graphs = LaunchGraphs(capture_graph) if self.reuse and options.graphs else None
        # False keeps the prep's launches in one chain on the call's stream (``_launch_all``)
        self.branch = options.branch
        self.sync = options.check == "sync"  # every call waits for its own NaN/Inf check

    def _workspace(self) -> dict:
        # normal tensors even when made inside inference mode: later calls outside it zero the flags in place
        with torch.inference_mode(False):
            ws = self.plan.buffers(self.device)
            ws["lse"] = torch.empty((self.B, self.H, self.Sq), dtype=torch.float32, device=self.device) \
                if self.lse_in_workspace else ws["scales"]  # never written when the LSE is off or returned
            # the stream-K kernel's extra arguments: the tail's pieces (after lse) and its plan (before the stream)
            ws["streamk"] = None
            if self.streamk is not None:
                o_part, lse_part = streamk_workspace(self.streamk, self.out_shape[3], self.dtype, self.device)
                ws["streamk"] = (o_part, lse_part, self.streamk[:3])
        # q_scales: the per-row Q descales with int8 Q/K (q_rot: the rotation matrix); otherwise never read (the
        # scales stand in)
        if self.q_rot:
            ws["q_scales"] = self.rot
            # the kernel sets Q's non-finite flag right after the scales (PrepPlan.buffers allocates them so)
            if ws["flags"].data_ptr() != ws["scales"].data_ptr() + ws["scales"].numel() * 4:
                raise DitprofError("internal: the prep's flags do not follow its scales")
        ws["ptrs"] = tuple(ws[n].data_ptr() for n in ("q8", "k8", "v8t", "scales", "lse")) + (
            ws["q_scales" if "q_scales" in ws else "scales"].data_ptr(),)
        sk = ws["streamk"]
        ws["streamk_ptrs"] = ((sk[0].data_ptr(), sk[1].data_ptr()), sk[2]) if sk else ((), ())
        ws["unchecked"] = 0
        return ws

    def __call__(self, q, k, v, softmax_scale: float, key_lens: Optional[torch.Tensor] = None, pro=None):
        self.calls += 1
        queue = pending_queue()
        capturing = torch._C._cuda_isCurrentStreamCapturing()
        if queue and not capturing:  # no event queries while a graph is being captured
            drain(queue, wait=False)
        prev = torch._C._cuda_getDevice()
        switch = prev != self.device_index
        if switch:
            torch.cuda.set_device(self.device_index)
        try:
            stream, stream_obj = _current_stream(self.device_index)
            if self.reuse and not capturing:
                ws = self._workspaces.get(stream)
                if ws is None:
                    ws = self._workspaces[stream] = self._workspace()
            else:
                ws = self._workspace()
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
            lse = torch.empty((self.B, self.H, self.Sq), dtype=torch.float32, device=self.device) \
                if self.return_lse else None
            scale = float(softmax_scale)
            if self.graphs is None or capturing:  # the caller's own capture: the prep may branch in it too
                self._launch_all(ws, q, k, v, out, lse, key_lens, scale, stream, capturing, pro)
            else:  # the key: every argument of the launches that the record does not fix
                key = (stream, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                       0 if key_lens is None else key_lens.data_ptr(), scale)
                if lse is not None:
                    key += (lse.data_ptr(),)
                if pro is not None:  # the prologue's weights and rotary table (rms_across: row factors), text rows
                    key += tuple(0 if t is None else t.data_ptr() for t in pro[:4] + pro[5:]) + (pro[4],)
                # s: None for a direct call on the current stream, else the capture stream's handle
                self.graphs.run(key, lambda s: self._launch_all(ws, q, k, v, out, lse, key_lens, scale,
                                                                stream if s is None else s, s is not None, pro),
                                stream_obj)
            if lse is not None and self.smooth_k:  # the smoothing shift scale * q . mean(k), added back
                lse = lse + scale * torch.einsum("bhsd,bhd->bhs", q.transpose(1, 2).float(), ws["k_mean"].float())
            if not capturing:
                if not self.reuse or self.sync:
                    self.check(ws, stream_obj, queue)
                    if self.sync:
                        drain(queue, wait=True)
                else:
                    n = ws["unchecked"] = ws["unchecked"] + 1
                    if n >= CHECK_EVERY:
                        self.check(ws, stream_obj, queue)
                    elif n == 1:
                        UNCHECKED[id(ws)] = (self, ws, stream_obj)
        finally:
            if switch:
                torch.cuda.set_device(prev)
        return out if lse is None else (out, lse)

    def launch_into(self, q, k, v, out, softmax_scale: float, key_lens: Optional[torch.Tensor] = None) -> None:
        """One call writing into the caller's ``out`` (the self-check's NaN-filled output), on a fresh workspace and
        the current stream: no graph, no NaN/Inf check; the LSE, where the build writes one, into a scratch
        tensor."""
        with torch.cuda.device(self.device):
            ws = self._workspace()
            stream, _ = _current_stream(self.device_index)
            lse = torch.empty((self.B, self.H, self.Sq), dtype=torch.float32, device=self.device) \
                if self.return_lse else None
            self._launch_all(ws, q, k, v, out, lse, key_lens, float(softmax_scale), stream)

    def _launch_all(self, ws: dict, q, k, v, out, lse, key_lens, scale: float, stream: int,
                    captured: bool = False, pro=None) -> None:
        """The call's launches on ``stream``: the prep, the kernel (and the stream-K merge). The prep's V quantize
        branches off beside its Q/K one when they are being captured into a CUDA graph (``captured``: the fork and
        join cost no host time in a replay) or the problem is too large to reuse a workspace (milliseconds of GPU
        work against a little host time for the fork and join)."""
        branch = branch_stream(self.device) if self.branch and (captured or not self.reuse) else None
        self.plan.launch(q, k, v, ws, stream, key_lens=key_lens, branch=branch, pro=pro)
        self._launch_kernel(ws, q, out, lse, key_lens, scale, stream)

    def _launch_kernel(self, ws: dict, q, out, lse, key_lens, softmax_scale: float, stream: int) -> None:
        """The kernel (``kernel_args.launch_kernel``) on the workspace's pointers (read once, ``ws["ptrs"]``) and
        the call's own: q with Q in the kernel, key_lens, out, a returned LSE, the stream; then the stream-K
        merge."""
        q8, k8, v8t, sc, ws_lse, qs = ws["ptrs"]
        if self.q_rot:  # the kernel reads the 16-bit q itself
            q8 = q.data_ptr()
        parts, plan = ws["streamk_ptrs"]  # both empty on the plain grid
        self.spec, self.fn = launch_kernel(
            self.spec, self.fn, q8, k8, v8t, sc, qs, key_lens.data_ptr() if key_lens is not None else sc,
            out.data_ptr(), ws_lse if lse is None else lse.data_ptr(), parts, self.sizes, softmax_scale, plan,
            stream)
        if self.merge is not None:  # the stream-K grid: the tail's pieces into out (and the LSE)
            o_part, lse_part, _ = ws["streamk"]
            self.merge(o_part, lse_part, out, stream, lse)

    def summary(self) -> dict:
        """What this configuration runs, for reports: shapes, kernel, Q/K format, grid (and the stream-K plan)."""
        grid = None
        if self.streamk is not None:
            n_full, n_tail, n_ctas_tail, n_kt = self.streamk
            grid = {"n_full": n_full, "n_tail": n_tail, "tail_ctas": n_ctas_tail, "key_tiles": n_kt}
        kernel = self.spec.kernel  # what ran: fp8-sm120 with its P V form
        if kernel == "fp8-sm120":
            kernel += f" {self.spec.pv_mma}"
        return {"q_shape": list(self.out_shape), "k_len": self.Sk, "dtype": DTYPE_NAMES[self.dtype],
                "kernel": kernel, "qk_format": "int8" if self.spec.qk_int8 else "e4m3",
                "key_lens": self.spec.key_lens, "grid": "stream-K" if grid else "plain", "streamk": grid,
                "q_in_kernel": self.spec.q_rot,
                "launch": "tvm_ffi" if self.spec.tvm_ffi else "jit", "self_check": self.self_check,
                "fallback": self.fallback}

    def replays(self) -> int:
        """Calls of this record replayed as a CUDA graph so far (``launch_graphs``)."""
        return self.graphs.hits if self.graphs is not None else 0

    def check(self, ws: dict, stream: torch.cuda.Stream, queue) -> None:
        """Queue a read of ``ws``'s flags (set by every prep since the last read), zeroing them after the copy."""
        ws["unchecked"] = 0
        UNCHECKED.pop(id(ws), None)
        queue.append(self.ring.start(ws["flags"], stream, zero=self.reuse))


# ------------------------------------------------------------------------------------------------ record cache

_CANON: dict = {}  # Fp8Options -> the first equal object seen (the one the records are keyed on)
_CANON_BY_ID: dict = {}  # id(options) -> (options, canonical): no hashing of the options per call
_CANON_BY_ID_MAX = 256


def canonical_options(options: Optional[Fp8Options]) -> Fp8Options:
    """The one object of ``options``' value (checked once; None: ``default_options()``)."""
    if options is None:
        options = default_options()
    hit = _CANON_BY_ID.get(id(options))
    if hit is not None and hit[0] is options:
        return hit[1]
    check_options(options)
    canon = _CANON.setdefault(options, options)
    if len(_CANON_BY_ID) >= _CANON_BY_ID_MAX:  # callers that make a new options object per call
        _CANON_BY_ID.clear()
    _CANON_BY_ID[id(options)] = (options, canon)  # holds options: its id stays its own
    return canon


_RECORDS: dict = {}


def record_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_lens: bool,
               options: Optional[Fp8Options] = None, return_lse: bool = False, prologue=None,
               pro_groups: int = 1) -> Fp8Launch:
    """The launch record of this call's configuration (built, with the full input checks, on first use); keyed on
    the inputs' layout and the (canonical) options object. fp8-sm120's first record per configuration runs its
    self-check first (``self_check``; an ``SdpaLaunch`` where no build passed)."""
    opts = canonical_options(options)
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
           k.device, v.device,
           (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16 == 0, key_lens, return_lse, id(opts), prologue,
           pro_groups)
    rec = _RECORDS.get(key)
    if rec is None:
        rec = _RECORDS[key] = _build(q, k, v, key_lens, opts, return_lse, prologue, pro_groups)
    return rec


def _build(q, k, v, key_lens: bool, options: Fp8Options, return_lse: bool, prologue=None,
           pro_groups: int = 1):
    """The record of a configuration (checked once): an ``Fp8Launch``, or for a fp8-sm120 configuration whose
    builds failed their self-check (``self_check``) an ``sdpa_fallback.SdpaLaunch``."""
    from ditprof.kernels.checks import SUPPORTED_HEAD_DIMS, check_qkv

    check_qkv(q, k, v, who="fp8 attention", head_dims=SUPPORTED_HEAD_DIMS, device_type="cuda", same_dtype=True,
              max_grid=65535)
    if any(x.stride(-1) != 1 for x in (q, k, v)):
        raise DitprofError("fp8 attention launch records need q, k, v with unit stride in head_dim")
    B, Sq, H, D = q.shape
    choice = choose_launch(arch_of(q.device.index), (B, H, Sq, k.shape[1], D), DTYPE_NAMES[q.dtype], options,
                           key_lens=key_lens, write_lse=return_lse,
                           q_in_kernel_ok=prologue is None and q_in_kernel_ok(q), device_index=q.device.index)
    # key counts compose with the prologue: the prep's K statistics stop at key_lens[b] whatever its loads compute
    if prologue is not None and (not choice.spec.qk_int8 or return_lse):
        raise DitprofError("the fused prologue needs the INT8 Q/K format and no returned LSE "
                           f"(this call: Q/K {'int8' if choice.spec.qk_int8 else 'e4m3'}, LSE {return_lse})")
    verdict = None
    if choice.spec.kernel == "fp8-sm120" and options.self_check:  # before any capture of this record's launches
        verdict = _self_check.checked(choice.spec, q.device.index, SELF_CHECK)
        if verdict.spec is None:  # neither P V form passed: torch SDPA on this configuration
            from ditprof.kernels.sdpa_fallback import SdpaLaunch

            return SdpaLaunch(q, k, key_lens, return_lse, prologue, verdict.fallback)
        choice = dataclasses.replace(choice, spec=verdict.spec)
    rec = Fp8Launch(q, k, v, choice, options, return_lse, prologue, pro_groups)
    if choice.spec.kernel == "fp8-sm120":
        rec.self_check = "off" if verdict is None else verdict.status
        rec.fallback = None if verdict is None else verdict.fallback
    return rec


# the options the self-check's own launch runs with: the shipped prep, K smoothed, no graph, no self-check of its own
CHECK_OPTIONS = Fp8Options(kernel="fp8-sm120", graphs=False, check="sync", self_check=False)


def run_for_check(spec, q, k, v, out, softmax_scale: float) -> None:
    """The build ``spec`` through a launch record of its own (``Fp8Launch.launch_into``: the prep and the kernel on
    the current stream), waiting for it: the self-check's kernel runner."""
    rec = Fp8Launch(q, k, v, LaunchChoice(spec), CHECK_OPTIONS, return_lse=spec.write_lse)
    key_lens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device) if spec.key_lens else None
    rec.launch_into(q, k, v, out, softmax_scale, key_lens)
    torch.cuda.synchronize(q.device)


SELF_CHECK = _self_check.SelfCheck(run_for_check, _self_check.run_emulation)  # the process's verdicts


def fp8_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
             key_lens: Optional[torch.Tensor] = None, *, layout: str = "BSHD", return_lse: bool = False,
             options: Optional[Fp8Options] = None, prologue=None, pro=None):
    """o in q's dtype and ``layout`` ("BSHD": q (B, Sq, H, D), k and v (B, Sk, H, D); "BHSD": (B, H, S, D)), CUDA
    bf16/fp16 with unit stride in head_dim, and with ``return_lse`` the LSE (B, H, Sq) float32. ``key_lens`` (B,)
    int32 on q's device: batch item b attends to its first key_lens[b] keys. The inputs are not checked per call
    (``record_for`` checks each configuration once)."""
    if layout != "BSHD":  # the record reads (B, S, H, D)-indexed views; a BHSD output is made contiguous
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    # prologue / pro: the fused prologue's spec and its tensors (wq, wk, cos, sin, text_rows; rms_across: then its
    # row factors rsq, rsk), q and k raw (its norm weights' groups, 1 or 2, are part of the configuration)
    groups = norm_groups(prologue, pro[0]) if pro is not None else 1
    res = record_for(q, k, v, key_lens is not None, options, return_lse, prologue, groups)(q, k, v, softmax_scale,
                                                                                          key_lens, pro)
    if layout == "BSHD":
        return res
    if return_lse:
        return res[0].transpose(1, 2).contiguous(), res[1]
    return res.transpose(1, 2).contiguous()


def clear_cache() -> None:
    """Drop every launch record, compiled kernel and self-check verdict (tests that compile a forced schedule)."""
    clear_compiled()
    SELF_CHECK.clear()
    _RECORDS.clear()


# ------------------------------------------------------------------------------------------------ launch summaries

def call_counts() -> dict:
    """{record id: (calls, graph replays) so far} of every launch record (``launch_summaries(since=...)`` takes
    it)."""
    return {id(rec): (rec.calls, rec.replays()) for rec in _RECORDS.values()}


def launch_summaries(since: Optional[dict] = None) -> list[dict]:
    """``Fp8Launch.summary()`` of every launch record called since the ``call_counts()`` snapshot ``since`` (all
    called records without it), each with the number of those calls and how many of them replayed a CUDA graph."""
    since = since or {}
    out = []
    for rec in _RECORDS.values():
        calls0, replays0 = since.get(id(rec), (0, 0))
        n = rec.calls - calls0
        if n > 0:
            out.append({**rec.summary(), "calls": n, "graph_replays": rec.replays() - replays0})
    return out


__all__ = ["Fp8Launch", "WORKSPACE_REUSE_BYTES", "call_counts", "canonical_options", "clear_cache", "fp8_call",
           "launch_summaries", "record_for", "rotation_t", "streamk_workspace"]
