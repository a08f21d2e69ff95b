"""The FP8 attention's launch path on CUDA: one compile cache for both arch kernels, one launch record per call
configuration, and the finiteness check of q, k, v without a host sync.

- ``KernelSpec`` (frozen) is everything a compiled kernel is specialised for; ``compiled(spec)`` is the one compile
  cache (both kernels, every caller). ``fp8-sm90`` and ``fp8-sm120`` compile from the same spec fields.
- ``Fp8Launch`` (the launch record) is built once per (device, shapes, strides, dtypes, alignment, key lengths,
  forced kernel) by ``record_for``: the prep plan (``prep_triton.PrepPlan``, whose launches skip Triton's per-call
  argument specialisation), the compiled kernel, the arguments that do not change and, for problems up to
  ``WORKSPACE_REUSE_BYTES``, the prep's workspace (one per stream: work on one stream is ordered, so the next call's
  prep writes it only after this call's kernel has read it; under CUDA-graph capture each call allocates its own).
  A call is then the prep's launches (two; three with INT8 Q/K), the kernel launch (and, on the stream-K grid, its
  merge) and the output allocation: no sync, no other allocation, no per-call argument checks (``record_for`` checks
  once per configuration). A call whose arguments repeat an earlier one's replays those launches as one CUDA graph
  (``launch_graphs``; reused workspaces only, ``DITPROF_FP8_GRAPHS=0`` turns it off).
- fp8-sm90 runs on the stream-K grid (``fp8_fwd_sm90_streamk``) where ``streamk_schedule.streamk_plan`` takes the
  problem (a partial last round after 1 to 16 full ones, no key_lens; ``streamk_for``, shared with the general
  path); ``DITPROF_FP8_STREAMK=0`` keeps the plain grid. The tail's pieces live in the workspace (``o_part``,
  ``lse_part``).
- Finiteness: a descale is non-finite exactly when its input held NaN/Inf; the prep's finalize kernel then sets a
  sticky flag for q, k or v in the workspace. Every ``CHECK_EVERY`` calls of a workspace (every call when it is not
  reused) the flags are copied to a slot of a pinned ring, with an event, and zeroed; every later call polls the
  queue (``event.query``, no wait) and raises ``DitprofError("q contains NaN or Inf")`` (or k, v) once a copy that
  holds a flag has landed. ``finish_finite_checks()`` reads the flags of every call made so far and waits (the
  harness and ``interface.deferred_finite_checks`` call it): a NaN input is reported at the latest there, never
  silently. ``DITPROF_FP8_CHECK=sync`` reads and waits at every call instead (the error then comes from the call).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Optional

import torch

from ditprof.errors import DitprofError
from ditprof.kernels.launch_graphs import LaunchGraphs, capture_graph, side_stream
from ditprof.kernels.prep import finish_finite_check
from ditprof.kernels.qk_format import qk_format

WORKSPACE_REUSE_BYTES = 64 << 20  # larger problems allocate per call: a few us against milliseconds of kernel
RING_DEPTH = 16
CHECK_EVERY = 8  # calls of one reused workspace between two reads of its non-finite flags
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}

# How launches go. cute's JIT executor converts the arguments in Python on every call (make_ptr, Int32 wrappers,
# ctypes packing), ~100 us of host time per launch; fp8-sm90 compiled with --enable-tvm-ffi takes raw ints
# (data_ptr()) and floats through TVM-FFI's C ABI instead. Used when apache-tvm-ffi is importable (the GPU host has
# it; nothing launches on the CPU CI) and DITPROF_TVM_FFI is not "0"; if a TVM-FFI call fails, the JIT path takes
# over for the rest of the process and "tvm_ffi_error" keeps the reason. "last_launch": "tvm_ffi" or "jit".
LAUNCH_INFO: dict = {"tvm_ffi_error": None, "last_launch": None}


def tvm_ffi_launch_enabled() -> bool:
    if os.environ.get("DITPROF_TVM_FFI", "1") == "0" or LAUNCH_INFO["tvm_ffi_error"] is not None:
        return False
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ compile cache

@dataclass(frozen=True)
class KernelSpec:
    """What one compiled FP8 attention kernel is specialised for (the compile cache's key)."""

    kernel: str  # "fp8-sm90" | "fp8-sm120"
    arch: str  # e.g. "sm_90a", "sm_120a", "sm_89"
    head_dim: int
    out_dtype: str  # "bfloat16" | "float16"
    write_lse: bool
    key_lens: bool  # per-batch key counts read on the device
    tvm_ffi: bool = False  # compiled for TVM-FFI's C ABI (raw ints for pointers and the stream)
    qk_int8: bool = False  # Q and K int8 with per-row Q descales (kernels.qk_format "int8")
    streamk: bool = False  # fp8-sm90 on the stream-K grid (fp8_fwd_sm90_streamk: workspace + merge)
    q_rot: bool = False  # fp8-sm90 INT8 with Q rotated and quantized in the kernel (16-bit q, the rotation matrix)


_COMPILED: dict = {}
_COMPILE_LOCK = threading.Lock()
COMPILE_STATS = {"compiles": 0, "hits": 0}


def compile_spec(spec: KernelSpec, *, fake: bool = False, options_extra: str = ""):
    """Compile ``spec`` (``fake``: no GPU needed, for inspection on any machine)."""
    if spec.kernel == "fp8-sm90":
        from ditprof.kernels import fp8_fwd_sm90 as K

        if not spec.write_lse:
            raise ValueError("fp8-sm90 always writes the LSE")
        if spec.streamk:
            from ditprof.kernels.fp8_fwd_sm90_streamk import compile_streamk

            if spec.q_rot:
                raise ValueError("the stream-K grid takes the prep's Q (no q_rot build)")

            return compile_streamk(spec.head_dim, spec.out_dtype, fake=fake, arch=spec.arch,
                                   options_extra=options_extra, tvm_ffi=spec.tvm_ffi, key_lens=spec.key_lens,
                                   qk_int8=spec.qk_int8)
        return K.compile_sm90(spec.head_dim, spec.out_dtype, fake=fake, arch=spec.arch, options_extra=options_extra,
                              tvm_ffi=spec.tvm_ffi, key_lens=spec.key_lens, qk_int8=spec.qk_int8, q_rot=spec.q_rot)
    if spec.kernel == "fp8-sm120":
        from ditprof.kernels import fp8_fwd_sm120 as K

        if spec.tvm_ffi or spec.streamk or spec.q_rot:
            raise ValueError("fp8-sm120 launches through cute's JIT executor, on its plain grid, with the prep's Q")
        return K.compile_fp8_fwd(spec.arch, spec.head_dim, spec.out_dtype, write_lse=spec.write_lse,
                                 early_v=K.default_early_v(spec.arch), extra_options=options_extra,
                                 key_lens=spec.key_lens, qk_int8=spec.qk_int8)
    raise DitprofError(f"unknown fp8 kernel {spec.kernel!r}")


def spec_for(kernel: str, arch: str, head_dim: int, dtype_name: str, write_lse: bool,
             key_lens: bool = False, qk_int8: bool = False) -> KernelSpec:
    """The spec of a call: fp8-sm90 always writes its LSE and launches through TVM-FFI where it can."""
    if kernel == "fp8-sm90":
        return KernelSpec(kernel, arch, head_dim, dtype_name, True, key_lens, tvm_ffi_launch_enabled(), qk_int8)
    return KernelSpec(kernel, arch, head_dim, dtype_name, write_lse, key_lens, qk_int8=qk_int8)


def compiled(spec: KernelSpec):
    """The compiled kernel for ``spec`` on the current device (compiled once per process)."""
    fn = _COMPILED.get(spec)
    if fn is not None:
        COMPILE_STATS["hits"] += 1
        return fn
    with _COMPILE_LOCK:
        fn = _COMPILED.get(spec)
        if fn is None:
            fn = compile_spec(spec)
            _COMPILED[spec] = fn
            COMPILE_STATS["compiles"] += 1
    return fn


def clear_cache() -> None:
    _COMPILED.clear()
    _RECORDS.clear()


# ------------------------------------------------------------------------------------------------ finiteness

class _Check(tuple):
    """(pinned host copy, event after the copy) plus the ring slot to give back once read. The copy is the sticky
    non-finite flags of q, k, v (int32 x 3, ``flags=True``) or the (B*H*3,) descales (the general path's prep)."""

    def __new__(cls, host, event, ring=None, slot=None, flags=False):
        self = super().__new__(cls, (host, event))
        self.ring, self.slot, self.flags = ring, slot, flags
        return self


def _raise_for(bad: list) -> None:
    for name, flag in zip(("q", "k", "v"), bad):
        if flag:
            raise DitprofError(f"{name} contains NaN or Inf")


def finish_check(item) -> None:
    """Wait for one check's copy (no-op for None), free its ring slot, raise on a non-finite input (flags here;
    the general path's descales through ``prep.finish_finite_check``)."""
    if item is None:
        return
    try:
        if getattr(item, "flags", False):
            item[1].synchronize()
            _raise_for(item[0].tolist())
        else:
            finish_finite_check(item)
    finally:
        ring = getattr(item, "ring", None)
        if ring is not None:
            ring.busy[item.slot] = False


_STATE = threading.local()


def pending_queue() -> collections.deque:
    """This thread's checks not read yet, in call order."""
    q = getattr(_STATE, "queue", None)
    if q is None:
        q = _STATE.queue = collections.deque()
    return q


def drain(queue, wait: bool) -> None:
    """Read the queued checks in call order: those whose copy has landed (``event.query()``, no wait), or all of
    them with ``wait``. Raises for the first non-finite one (which is then out of the queue)."""
    while queue and (wait or queue[0][1].query()):
        finish_check(queue.popleft() if isinstance(queue, collections.deque) else queue.pop(0))


# reused workspaces whose flags have not been read since their last calls: id -> (record, workspace, stream)
_UNCHECKED: dict = {}


def finish_finite_checks() -> None:
    """Read the flags of every call made so far and wait for every pending check of this thread;
    ``DitprofError`` for the first NaN/Inf input."""
    queue = pending_queue()
    for rec, ws, stream in list(_UNCHECKED.values()):
        with torch.cuda.stream(stream):
            rec.check(ws, stream, queue)
    drain(queue, wait=True)


class _Ring:
    """Pinned host slots for one configuration's non-finite flags, and an event per slot."""

    def __init__(self):
        with torch.inference_mode(False):  # normal tensors: written in place inside and outside inference mode
            self.host = torch.empty((RING_DEPTH, 3), dtype=torch.int32, pin_memory=True)
        self.events = [torch.cuda.Event() for _ in range(RING_DEPTH)]
        self.busy = [False] * RING_DEPTH
        self.next = 0

    def start(self, flags: torch.Tensor, stream: torch.cuda.Stream, zero: bool) -> _Check:
        """Copy ``flags`` to a free slot on ``stream`` (the current stream), then zero them there if ``zero``."""
        i = self.next
        queue = pending_queue()
        while self.busy[i]:  # the host is RING_DEPTH checks of this configuration ahead: wait for the oldest
            drain(queue, wait=False)
            if self.busy[i]:
                finish_check(queue.popleft())
        self.next = (i + 1) % RING_DEPTH
        self.busy[i] = True
        host = self.host[i]
        host.copy_(flags, non_blocking=True)
        self.events[i].record(stream)
        if zero:
            flags.zero_()
        return _Check(host, self.events[i], self, i, flags=True)


# os.environ's own store: a lookup of an unset name through os.environ.get raises and catches a KeyError inside,
# ~1 us each on the H200 host, and every call reads three settings (os.environ[...] = ... updates this store too)
_ENV_STORE = getattr(os.environ, "_data", None) if os.name == "posix" else None


def env_setting(name: bytes) -> Optional[str]:
    """An environment variable as os.environ has it now (None if unset), on the per-call path."""
    if _ENV_STORE is None:
        return os.environ.get(name.decode())
    value = _ENV_STORE.get(name)
    return None if value is None else os.fsdecode(value)


def sync_checks() -> bool:
    """``DITPROF_FP8_CHECK=sync``: every call waits for its own NaN/Inf check."""
    return env_setting(b"DITPROF_FP8_CHECK") == "sync"


def branch_stream(device) -> torch.cuda.Stream:
    """The side stream of ``device`` that preps branch onto (``Fp8Launch._launch_all``)."""
    return side_stream(device, "branch")


def switch_on(name: str, setting: Optional[str]) -> bool:
    """The value ``setting`` of the on/off switch ``name`` (``DITPROF_FP8_STREAMK``, ``_QROT``, ``_GRAPHS``,
    ``_BRANCH``; each on by default): unset, "" or "1" on, "0" off, anything else a one-line error."""
    if setting in (None, "", "1"):
        return True
    if setting == "0":
        return False
    raise DitprofError(f"{name} must be 0 or 1, got {setting!r}")


def q_rot_for(spec: "KernelSpec", streamk: Optional[tuple], q: torch.Tensor) -> bool:
    """Whether a launch record quantizes Q in the kernel (``q_rot``): fp8-sm90 INT8 on the plain grid with a
    contiguous, 16-byte aligned (B, Sq, H, D) q, unless ``DITPROF_FP8_QROT`` is "0". The prep then skips Q. H200, the
    op's call, both records in one process (benchmarks/NOTES.md, session 18): the same output bits; CogVideoX -1.5 %,
    h3 -0.4 / -0.5 %, HunyuanVideo -0.3 %, Wan 14B within noise. The stream-K grid keeps the prep's Q (with Q in the
    kernel on every CTA, H200: flux +1.4 %, Wan 1.3B +2.3 %; on the whole-tile CTAs only, H100: flux / ltx / Wan 1.3B
    +0.8 / +0.8 / +0.9 %), and so does the general path (``interface.launch_prepared``)."""
    on = switch_on("DITPROF_FP8_QROT", env_setting(b"DITPROF_FP8_QROT"))
    # not for a record first made inside a graph capture: the rotation matrix's copy to the device cannot be
    # captured (such a record keeps the prep's Q)
    return (spec.kernel == "fp8-sm90" and spec.qk_int8 and streamk is None and on
            and q.is_contiguous() and q.data_ptr() % 16 == 0 and not torch.cuda.is_current_stream_capturing())


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


# ------------------------------------------------------------------------------------------------ arch

def arch_for_capability(cap: tuple[int, int]) -> str:
    """Compute capability -> the arch string the kernel is compiled for (DitprofError if unsupported)."""
    major, minor = cap
    if (major, minor) == (8, 9):
        return "sm_89"
    if major == 9:
        return "sm_90a"  # mma.sync e4m3 emulated with HMMA: correct, not fast
    if major == 10:
        return "sm_100a" if minor == 0 else f"sm_10{minor}a"  # emulated as on Hopper
    if major == 12:
        return f"sm_12{minor}a"
    raise DitprofError(
        f"fp8 attention needs an sm_89, sm_90, sm_100 or sm_120 class GPU, got compute capability {major}.{minor}"
    )


KERNELS = ("fp8-sm120", "fp8-sm90")


def kernel_name_for_arch(arch: str, requested: Optional[str] = None) -> str:
    """Which kernel runs on ``arch``: the Hopper-native wgmma kernel on sm_90a, the mma.sync one elsewhere.

    ``requested`` (or the ``DITPROF_FP8_KERNEL`` environment variable) forces one: ``fp8-sm120`` also runs on
    Hopper (its FP8 mma.sync is emulated there: correct, slow), which is useful to compare the two.
    """
    requested = requested or os.environ.get("DITPROF_FP8_KERNEL") or "auto"
    if requested == "auto":
        return "fp8-sm90" if arch == "sm_90a" else "fp8-sm120"
    if requested not in KERNELS:
        raise DitprofError(f"unknown fp8 kernel {requested!r}; known: auto, {', '.join(KERNELS)}")
    if requested == "fp8-sm90" and arch != "sm_90a":
        raise DitprofError(f"kernel fp8-sm90 needs an sm_90a GPU (H100/H200), this one is {arch}")
    return requested


# ------------------------------------------------------------------------------------------------ launch record

_ARCH_BY_DEVICE: dict = {}


_STREAMS: dict = {}


def _current_stream(device_index: int) -> tuple[int, torch.cuda.Stream]:
    """(raw handle, torch.cuda.Stream) of the current stream; the object is built once per handle (building one per
    call costs a few us; the handle alone is what inductor's launchers read)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    raw = get(device_index) if get is not None else torch.cuda.current_stream(device_index).cuda_stream
    obj = _STREAMS.get(raw)
    if obj is None or obj.cuda_stream != raw:
        obj = _STREAMS[raw] = torch.cuda.current_stream(device_index)
    return raw, obj


def arch_of(device_index: int) -> str:
    arch = _ARCH_BY_DEVICE.get(device_index)
    if arch is None:
        arch = _ARCH_BY_DEVICE[device_index] = arch_for_capability(torch.cuda.get_device_capability(device_index))
    return arch


def streamk_for(kernel: str, arch: str, B: int, H: int, Sq: int, Sk: int, D: int, key_lens: bool,
                device_index: int, setting: Optional[str] = None) -> Optional[tuple]:
    """The stream-K plan (n_full, n_tail, T, n_kt) of a call, or None for the plain grid: fp8-sm90 without key_lens,
    ``DITPROF_FP8_STREAMK`` (``setting``; read now when None) not "0", and a grid ``streamk_plan`` takes. One
    decision for the launch record and the general path (``interface.launch_prepared``): both give the same bits."""
    if setting is None:
        setting = env_setting(b"DITPROF_FP8_STREAMK")
    # "0" keeps the plain grid
    if kernel != "fp8-sm90" or key_lens or not switch_on("DITPROF_FP8_STREAMK", setting):
        return None
    from ditprof.kernels.fp8_fwd_sm90 import config_for
    from ditprof.kernels.streamk_schedule import streamk_plan

    return streamk_plan(B, H, Sq, Sk, config_for(arch, D).tile_n, sm_count(device_index))


def streamk_workspace(plan: tuple, D: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The tail's pieces for ``plan``: O (2 T, 192, D) in ``dtype`` and the LSE (2 T, 192) float32."""
    from ditprof.kernels.streamk_schedule import TILE_M

    slots = 2 * plan[2]
    return (torch.empty((slots, TILE_M, D), dtype=dtype, device=device),
            torch.empty((slots, TILE_M), dtype=torch.float32, device=device))


def sm_count(device_index: int) -> int:
    """The device's SM count (the stream-K grid's tail width; tests replace it to give small problems a tail)."""
    from ditprof.kernels.prep_triton import sm_count as cached_sm_count

    return cached_sm_count(device_index)


class Fp8Launch:
    """Everything one call configuration needs, computed once (see the module docstring)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str, key_lens: bool,
                 qk_int8: bool = False, streamk: Optional[str] = None, graphs: Optional[str] = None,
                 branch: Optional[str] = None):
        from ditprof.kernels.prep_triton import PrepPlan

        B, Sq, H, D = q.shape
        Sk = k.shape[1]
        self.device = q.device
        self.device_index = q.device.index
        self.B, self.Sq, self.Sk, self.H = B, Sq, Sk, H
        self.out_shape = (B, Sq, H, D)
        self.dtype = q.dtype
        self.spec = spec_for(kernel, arch_of(self.device_index), D, DTYPE_NAMES[q.dtype], write_lse=False,
                             key_lens=key_lens, qk_int8=qk_int8)
        # the stream-K grid (one kernel + one merge launch) where streamk_for takes the call
        self.streamk = streamk_for(kernel, self.spec.arch, B, H, Sq, Sk, D, key_lens, self.device_index, streamk)
        # Q rotated and quantized in the kernel where q_rot_for takes the call (the prep then skips Q)
        self.q_rot = q_rot_for(self.spec, self.streamk, q)
        self.rot = None
        if self.q_rot:
            self.spec = dataclasses.replace(self.spec, q_rot=True)
            self.rot = rotation_t(D, q.dtype, q.device)  # made now: never inside a graph capture
        # the descales over each item's own keys
        self.plan = PrepPlan(q, k, v, True, key_lens=key_lens, qk_int8=qk_int8, skip_q=self.q_rot)
        self.sq_pad, self.sk_pad = self.plan.Sq_pad, self.plan.Sk_pad
        self.merge = None
        with torch.cuda.device(self.device):
            if self.streamk is not None:
                from ditprof.kernels.streamk_merge import MergeLaunch

                n_full, n_tail, n_ctas_tail, n_kt = self.streamk
                self.spec = dataclasses.replace(self.spec, streamk=True)
                self.merge = MergeLaunch(n_full, n_tail, n_ctas_tail, n_kt, H, Sq, D, self.device)
            self.fn = compiled(self.spec)
        bufs = self.plan.buffers("meta")
        lse_bytes = B * H * Sq * 4 if self.spec.write_lse else 0
        ws_bytes = sum(t.numel() * t.element_size() for t in bufs.values()) + lse_bytes
        self.reuse = ws_bytes <= WORKSPACE_REUSE_BYTES
        self._workspaces: dict = {}
        self.ring = _Ring()
        self.sizes = (B, H, Sq, Sk, self.sq_pad, self.sk_pad)
        self.calls = 0  # calls made through this record (``launch_summaries``)
        # repeated calls replayed as one CUDA graph (reused workspaces only: their addresses are the record's);
        # DITPROF_FP8_GRAPHS=0 launches every call directly
        self.graphs = LaunchGraphs(capture_graph) if self.reuse and switch_on("DITPROF_FP8_GRAPHS", graphs) else None
        # DITPROF_FP8_BRANCH=0 keeps the prep's launches in one chain on the call's stream (``_launch_all``)
        self.branch = switch_on("DITPROF_FP8_BRANCH", branch)

    def _workspace(self) -> dict:
        # normal tensors even when made inside inference mode: later calls outside it zero the flags in place
        with torch.inference_mode(False):
            ws = self.plan.buffers(self.device)
            ws["lse"] = torch.empty((self.B, self.H, self.Sq), dtype=torch.float32, device=self.device) \
                if self.spec.write_lse else ws["scales"]  # never written when the LSE is off
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

    def __call__(self, q, k, v, softmax_scale: float, key_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
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
            scale = float(softmax_scale)
            if self.graphs is None or capturing:  # the caller's own capture: the prep may branch in it too
                self._launch_all(ws, q, k, v, out, key_lens, scale, stream, capturing)
            else:  # the key: every argument of the launches that the record does not fix
                key = (stream, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                       0 if key_lens is None else key_lens.data_ptr(), scale)
                # s: None for a direct call on the current stream, else the capture stream's handle
                self.graphs.run(key, lambda s: self._launch_all(ws, q, k, v, out, key_lens, scale,
                                                                stream if s is None else s, s is not None),
                                stream_obj)
            if not capturing:
                sync = sync_checks()
                if not self.reuse or sync:
                    self.check(ws, stream_obj, queue)
                    if sync:
                        drain(queue, wait=True)
                else:
                    n = ws["unchecked"] = ws["unchecked"] + 1
                    if n >= CHECK_EVERY:
                        self.check(ws, stream_obj, queue)
                    elif n == 1:
                        _UNCHECKED[id(ws)] = (self, ws, stream_obj)
        finally:
            if switch:
                torch.cuda.set_device(prev)
        return out

    def _launch_all(self, ws: dict, q, k, v, out, key_lens, scale: float, stream: int,
                    captured: bool = False) -> None:
        """The call's launches on ``stream``: the prep, the kernel (and the stream-K merge). The prep's V quantize
        branches off beside its Q/K one when they are being captured into a CUDA graph (``captured``: the fork and
        join cost no host time in a replay) or the problem is too large to reuse a workspace (milliseconds of GPU
        work against ~10 us of host time for the fork and join)."""
        branch = branch_stream(self.device) if self.branch and (captured or not self.reuse) else None
        self.plan.launch(q, k, v, ws, stream, key_lens=key_lens, branch=branch)
        self._launch_kernel(ws, q, out, key_lens, scale, stream)

    def summary(self) -> dict:
        """What this configuration runs, for reports: shapes, kernel, Q/K format, grid (and the stream-K plan)."""
        grid = None
        if self.streamk is not None:
            n_full, n_tail, n_ctas_tail, n_kt = self.streamk
            grid = {"n_full": n_full, "n_tail": n_tail, "tail_ctas": n_ctas_tail, "key_tiles": n_kt}
        return {"q_shape": list(self.out_shape), "k_len": self.Sk, "dtype": DTYPE_NAMES[self.dtype],
                "kernel": self.spec.kernel, "qk_format": "int8" if self.spec.qk_int8 else "e4m3",
                "key_lens": self.spec.key_lens, "grid": "stream-K" if grid else "plain", "streamk": grid,
                "q_in_kernel": self.spec.q_rot,
                "launch": "tvm_ffi" if self.spec.tvm_ffi else "jit"}

    def replays(self) -> int:
        """Calls of this record replayed as a CUDA graph so far (``launch_graphs``)."""
        return self.graphs.hits if self.graphs is not None else 0

    def check(self, ws: dict, stream: torch.cuda.Stream, queue) -> None:
        """Queue a read of ``ws``'s flags (set by every prep since the last read), zeroing them after the copy."""
        ws["unchecked"] = 0
        _UNCHECKED.pop(id(ws), None)
        queue.append(self.ring.start(ws["flags"], stream, zero=self.reuse))

    def _launch_kernel(self, ws: dict, q, out, key_lens, softmax_scale: float, stream: int) -> None:
        if self.spec.tvm_ffi:
            try:  # the workspace's pointers are read once (ws["ptrs"]); the output's and the stream per call
                q8, k8, v8t, sc, lse, qs = ws["ptrs"]
                if self.q_rot:  # the kernel reads the 16-bit q itself
                    q8 = q.data_ptr()
                parts, plan = ws["streamk_ptrs"]  # both empty on the plain grid
                self.fn(q8, k8, v8t, sc, qs, key_lens.data_ptr() if key_lens is not None else sc, out.data_ptr(),
                        lse, *parts, *self.sizes, softmax_scale, *plan, stream)
                self._merge(ws, out, stream)
                return
            except Exception:  # noqa: BLE001 -- launch_compiled records the reason and falls back
                pass
        self.spec, self.fn = launch_compiled(
            self.spec, self.fn, q if self.q_rot else ws["q8"], ws["k8"], ws["v8t"], ws["scales"], ws.get("q_scales"),
            key_lens, out,
            ws["lse"], self.B, self.H, self.Sq, self.Sk, softmax_scale, stream, streamk=ws["streamk"])
        self._merge(ws, out, stream)

    def _merge(self, ws: dict, out, stream: int) -> None:
        if self.merge is not None:  # the stream-K grid: the tail's pieces into out
            o_part, lse_part, _ = ws["streamk"]
            self.merge(o_part, lse_part, out, stream)


def launch_compiled(spec: KernelSpec, fn, q8, k8, v8t, scales, q_scales, key_lens, out, lse, B: int, H: int,
                    Sq: int, Sk: int, softmax_scale: float, stream: int, out_strides: Optional[tuple] = None,
                    streamk: Optional[tuple] = None):
    """Launch a compiled kernel on the prep's buffers (``stream``: a raw CUDA stream handle). Both kernels take the
    same arguments here; ``out_strides`` (b, h, s) is fp8-sm120's (fp8-sm90 writes a contiguous (B,Sq,H,D)).
    ``q_scales`` (B, H, Sq_pad) float32: the per-row Q descales of int8 Q/K (``spec.qk_int8``), else None.
    ``streamk`` (o_part, lse_part, (n_full, n_tail, T)): the workspace and plan of a ``spec.streamk`` build (the
    kernel only: the caller merges). Returns (spec, fn) actually used: a TVM-FFI call that fails falls back to cute's
    JIT executor for good."""
    D = q8.shape[3]
    sq_pad, sk_pad = q8.shape[2], k8.shape[2]
    if spec.q_rot:  # q8 is the 16-bit q (B, Sq, H, D), q_scales the rotation matrix
        from ditprof.kernels.prep import padded_lengths

        sq_pad = padded_lengths(Sq, Sk)[0]
    if spec.qk_int8 != (q_scales is not None):
        raise DitprofError("int8 Q/K kernels take per-row Q descales (q_scales), e4m3 ones do not")
    if spec.kernel == "fp8-sm90" and out.data_ptr() % 16:
        raise DitprofError(f"fp8-sm90 stores O in 16-byte words: out must be 16-byte aligned "
                           f"(data_ptr {out.data_ptr():#x})")
    if spec.streamk != (streamk is not None):
        raise DitprofError("a stream-K build takes its workspace and plan (streamk=...), a plain one does not")
    lens_ptr = key_lens.data_ptr() if key_lens is not None else scales.data_ptr()  # not read unless key_lens
    qs_ptr = q_scales.data_ptr() if q_scales is not None else scales.data_ptr()  # not read unless qk_int8
    ws_ptrs, trailing = (), ()
    if streamk is not None:
        ws_ptrs, trailing = (streamk[0].data_ptr(), streamk[1].data_ptr()), tuple(streamk[2])
    if spec.tvm_ffi:
        try:
            fn(q8.data_ptr(), k8.data_ptr(), v8t.data_ptr(), scales.data_ptr(), qs_ptr, lens_ptr, out.data_ptr(),
               lse.data_ptr(), *ws_ptrs, B, H, Sq, Sk, sq_pad, sk_pad, softmax_scale, *trailing, stream)
            LAUNCH_INFO["last_launch"] = "tvm_ffi"
            return spec, fn
        except Exception as exc:  # noqa: BLE001 -- argument conversion fails before anything is launched
            LAUNCH_INFO["tvm_ffi_error"] = f"{type(exc).__name__}: {exc}"[:500]
            spec = KernelSpec(**{**spec.__dict__, "tvm_ffi": False})
            fn = compiled(spec)
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    gm = cute.AddressSpace.gmem
    f8 = cutlass.Float8E4M3FN
    qk8 = cutlass.Int8 if spec.qk_int8 else f8
    out_ty = cutlass.BFloat16 if out.dtype == torch.bfloat16 else cutlass.Float16

    def ptr(ty, t, align):
        return cute.runtime.make_ptr(ty, t if isinstance(t, int) else t.data_ptr(), gm, assumed_align=align)

    I32 = cutlass.Int32
    if spec.kernel == "fp8-sm90":
        ws = (ptr(out_ty, ws_ptrs[0], 16), ptr(cutlass.Float32, ws_ptrs[1], 4)) if ws_ptrs else ()
        fn(ptr(qk8, q8, 16), ptr(qk8, k8, 16), ptr(f8, v8t, 16), ptr(cutlass.Float32, scales, 4),
           ptr(cutlass.Float32, qs_ptr, 16 if spec.q_rot else 4), ptr(cutlass.Int32, lens_ptr, 4),
           ptr(out_ty, out, 16), ptr(cutlass.Float32, lse, 4), *ws,
           I32(B), I32(H), I32(Sq), I32(Sk), I32(sq_pad), I32(sk_pad), cutlass.Float32(softmax_scale),
           *(I32(x) for x in trailing), cuda.CUstream(stream))
    else:
        sb, sh, ss = out_strides if out_strides is not None else (Sq * H * D, D, H * D)
        fn(ptr(qk8, q8, 16), ptr(qk8, k8, 16), ptr(f8, v8t, 16), ptr(out_ty, out, 16), ptr(cutlass.Float32, lse, 4),
           ptr(cutlass.Float32, scales, 4), ptr(cutlass.Float32, qs_ptr, 4), ptr(cutlass.Int32, lens_ptr, 4),
           I32(B), I32(H), I32(Sq), I32(Sk),
           cutlass.Int64(sb), cutlass.Int64(sh), I32(ss), cutlass.Float32(softmax_scale), cuda.CUstream(stream))
    LAUNCH_INFO["last_launch"] = "jit"
    return spec, fn


_RECORDS: dict = {}


def record_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_lens: bool,
               kernel: Optional[str] = None) -> Fp8Launch:
    """The launch record of this call's configuration (built, with the full input checks, on first use)."""
    kernel = kernel or env_setting(b"DITPROF_FP8_KERNEL")  # a forced kernel is part of the configuration
    fmt = env_setting(b"DITPROF_FP8_QK")  # so is a Q/K format (kernels.qk_format)
    grid = env_setting(b"DITPROF_FP8_STREAMK")  # and the stream-K switch
    qrot = env_setting(b"DITPROF_FP8_QROT")  # and the Q-in-the-kernel switch
    graphs = env_setting(b"DITPROF_FP8_GRAPHS")  # and the graph replay switch
    branch = env_setting(b"DITPROF_FP8_BRANCH")  # and the prep branch switch
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
           k.device, v.device,
           (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16 == 0, key_lens, kernel, fmt, grid, qrot, graphs, branch)
    rec = _RECORDS.get(key)
    if rec is None:
        rec = _RECORDS[key] = _build(q, k, v, key_lens, kernel, qk_format(fmt, q.shape[-1]) == "int8", grid, graphs,
                                     branch)
    return rec


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


def _build(q, k, v, key_lens: bool, kernel: Optional[str], qk_int8: bool,
           streamk: Optional[str] = None, graphs: Optional[str] = None, branch: Optional[str] = None) -> Fp8Launch:
    from ditprof.kernels.checks import SUPPORTED_HEAD_DIMS, check_qkv

    check_qkv(q, k, v, who="fp8 attention", head_dims=SUPPORTED_HEAD_DIMS, device_type="cuda", same_dtype=True,
              max_grid=65535)
    if any(x.stride(-1) != 1 for x in (q, k, v)):
        raise DitprofError("fp8 attention launch records need q, k, v with unit stride in head_dim")
    name = kernel_name_for_arch(arch_of(q.device.index), kernel)
    return Fp8Launch(q, k, v, name, key_lens, qk_int8, streamk, graphs, branch)


def fp8_attention_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                       key_lens: Optional[torch.Tensor] = None, kernel: Optional[str] = None) -> torch.Tensor:
    """o (B, Sq, H, D) in q's dtype; q (B, Sq, H, D), k and v (B, Sk, H, D) CUDA bf16/fp16 with unit stride in
    head_dim. ``key_lens`` (B,) int32 on q's device: batch item b attends to its first key_lens[b] keys."""
    return record_for(q, k, v, key_lens is not None, kernel)(q, k, v, softmax_scale, key_lens)


def compact_keys(k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor):
    """Any key subset as a prefix, on the device (no sync, CUDA-graph capturable): ``keep`` (B, Sk) bool ->
    (k, v with each batch item's kept keys first, in order, and the others zeroed; key_lens (B,) int32).
    Zeroing keeps dropped keys out of the descales; attention over a key subset does not depend on key order."""
    order = torch.sort((~keep).to(torch.uint8), dim=1, stable=True).indices
    kept = torch.gather(keep, 1, order)[:, :, None, None]
    idx = order[:, :, None, None].expand(-1, -1, k.shape[2], k.shape[3])
    zero = torch.zeros((), dtype=k.dtype, device=k.device)
    k2 = torch.where(kept, torch.gather(k, 1, idx), zero)
    v2 = torch.where(kept, torch.gather(v, 1, idx), zero)
    return k2, v2, keep.sum(dim=1, dtype=torch.int32)


__all__ = ["KernelSpec", "LAUNCH_INFO", "spec_for", "tvm_ffi_launch_enabled", "compile_spec", "compiled",
           "clear_cache", "COMPILE_STATS", "Fp8Launch", "record_for",
           "fp8_attention_cuda", "compact_keys", "finish_finite_checks", "drain", "pending_queue",
           "WORKSPACE_REUSE_BYTES", "RING_DEPTH", "streamk_for", "streamk_workspace", "sm_count",
           "call_counts", "launch_summaries"]

