"""What every block family adapter knows about its diffusers model.

An adapter maps a diffusers transformer (named by ``_class_name`` in its ``config.json``) to
the blocks inside it: which ``nn.ModuleList`` attribute holds them, the block class, how to
build one block from the config, and how to make the inputs the parent model would hand it.
"""

from __future__ import annotations

import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ditprof.errors import DitprofError


@dataclass(frozen=True)
class BlockKind:
    """One stack of blocks inside a model: ``main`` (the only stack), ``double`` or ``single``."""

    name: str
    attribute: str  # nn.ModuleList attribute on the diffusers model, e.g. "blocks"
    count_key: str  # config key holding how many blocks the stack has


@dataclass(frozen=True)
class LatentGrid:
    """Token grid after VAE compression and patchify: frames x height x width tokens."""

    frames: int
    height: int
    width: int
    packed = False  # class constant, not a field: a layout of several modalities in one sequence overrides it

    @property
    def tokens(self) -> int:
        """Rows of the block's hidden states (a packed layout counts every modality's rows)."""
        return self.video_tokens

    @property
    def video_tokens(self) -> int:
        return self.frames * self.height * self.width

    def describe(self) -> str:
        return f"{self.frames}x{self.height}x{self.width} (frames x height x width tokens)"


@dataclass(frozen=True)
class SeqSplit:
    """How one block input is split under sequence parallelism (the role of diffusers' ContextParallelInput).

    ``dim`` is the sequence dimension. ``text``: the same dimension also holds the replicated text rows, kept
    whole on every rank -- ``"first"`` (the text rows come before the image rows) or ``"last"``. ``ndim``: split
    only a tensor of that rank (an input whose layout depends on the config, e.g. Wan 2.2 TI2V's per-token temb).
    """

    dim: int
    text: str | None = None
    ndim: int | None = None


@dataclass(frozen=True)
class BlockPlan:
    """What the harness needs to know about a block's inputs and outputs, declared by the family (the role of
    diffusers' ``_cp_plan``): generic code reads this instead of branching on family names.

    ``outputs``: names of the inputs the block's return values feed in the next block, in return order (one
    name: a bare tensor). ``sp``: per input name the sequence split (a tuple input such as a rotary
    ``(cos, sin)`` pair takes the split for each item, or a tuple of splits, one per item, ``None`` for an item
    kept whole); inputs not named are replicated; ``None``: sequence
    parallelism is not wired up for this block. ``joint_text``: ``"first"`` / ``"last"`` when self-attention runs
    jointly over [text, image] with the text replicated; ``None``: plain self-attention over the sharded rows.
    """

    outputs: tuple[str, ...] = ("hidden_states",)
    sp: dict[str, SeqSplit | tuple[SeqSplit | None, ...]] | None = None
    joint_text: str | None = None

    @property
    def hidden(self) -> str:
        return "hidden_states"

    @property
    def output_index(self) -> int | None:
        return None if len(self.outputs) == 1 else self.outputs.index(self.hidden)


class _BlockReached(Exception):
    """Raised by the placeholder block: the model's forward got as far as its first block of the stack."""

    def __init__(self, args: tuple, kwargs: dict):
        super().__init__("block reached")
        self.args, self.kwargs = args, kwargs


class _StopAtBlock(torch.nn.Module):
    def forward(self, *args, **kwargs):
        raise _BlockReached(args, kwargs)


class _Unused(torch.nn.Module):
    """Stands in for a module whose output the captured path never reads (it would need weights)."""

    def forward(self, *args, **kwargs):
        return None


# why a modulation projection stays bf16 under FP8 linears: it maps the timestep embedding (one row per sample),
# so FP8 saves nothing, and its output scales and shifts every activation of the block
MODULATION = "modulation of the timestep embedding (one row per sample: no FP8 gain, it scales every activation)"


class BlockFamily:
    """Base adapter. Subclasses fill the class attributes and the input builder."""

    name: str = ""
    class_names: tuple[str, ...] = ()  # diffusers `_class_name` values this adapter handles
    kinds: tuple[BlockKind, ...] = ()
    uses_dispatcher: bool = True  # attention goes through diffusers' attention dispatcher
    default_text_tokens: int = 512
    vae_stride: tuple[int, int, int] = (4, 8, 8)  # (time, height, width)
    is_video: bool = True
    default_size: tuple[int, int, int] = (480, 832, 81)  # (height, width, frames)
    max_axis_tokens: int | None = None  # longest grid axis the model's RoPE table covers
    pipeline_timestep: float = 500.0  # the timestep the pipeline hands the model mid-denoising, in its units
    # linears that stay bf16 when the block's linears run in FP8: (fnmatch pattern over the block's module names,
    # why); harness.swaps.linears adds torchao's own limits (sizes, fp32-kept weights)
    fp8_keep_linears: tuple[tuple[str, str], ...] = ()
    # why this family's attention has no fused prologue (norm_q/norm_k + RoPE inside the FP8 prep); "" where
    # ``prologue_processor`` gives one
    prologue_missing: str = "its adapter declares no fused attention prologue"

    def prologue_processor(self, module: torch.nn.Module, attend: Callable) -> Any:
        """A processor for attention ``module`` that projects as the model's does and hands the RAW projections
        to ``attend(q, k, v, wq=, wk=, eps=, rope=, cos=, sin=, text_rows=)`` (harness.swaps.prologue: norm and
        RoPE fused into the FP8 prep), or None where this module keeps its own processor."""
        return None

    # ----- model / block classes -------------------------------------------------------------
    @property
    def model_class(self) -> type:
        raise NotImplementedError

    def block_class(self, kind: str) -> type:
        raise NotImplementedError

    @property
    def keep_in_fp32(self) -> tuple[str, ...]:
        """Module names diffusers keeps in fp32 even when the model is cast to bf16."""
        return tuple(getattr(self.model_class, "_keep_in_fp32_modules", None) or ())

    def keeps_fp32(self, name: str) -> bool:
        """diffusers' rule: a tensor stays fp32 if a dotted component of its name is a kept module."""
        return not set(self.keep_in_fp32).isdisjoint(name.split("."))

    def tensor_dtype(self, name: str, dtype: torch.dtype | None) -> torch.dtype | None:
        """The dtype a block tensor is loaded in: fp32 where diffusers keeps it, else ``dtype``."""
        return torch.float32 if self.keeps_fp32(name) else dtype

    def checked_n_blocks(self, config: dict, kind: str, indices, owner: str) -> int:
        """Blocks in the ``kind`` stack; a one-line error naming the first index outside it."""
        n = self.n_blocks(config, kind)
        bad = [i for i in indices if not 0 <= i < n]
        if bad:
            raise DitprofError(f"block index {bad[0]} out of range: {owner} {kind} stack has {n} blocks")
        return n

    def kind(self, name: str | None) -> BlockKind:
        if name is None:
            return self.kinds[0]
        for k in self.kinds:
            if k.name == name:
                return k
        raise DitprofError(
            f"family {self.name} has no block kind {name!r} (known: {', '.join(k.name for k in self.kinds)})"
        )

    def stack(self, model: torch.nn.Module, kind: str | None) -> torch.nn.ModuleList:
        """The ``kind`` stack's ModuleList inside a whole model (the attribute may be dotted)."""
        return operator.attrgetter(self.kind(kind).attribute)(model)

    def prefix(self, kind: str | None, index: int) -> str:
        """State-dict prefix of block ``index`` of the given stack, e.g. ``blocks.3.``."""
        return f"{self.kind(kind).attribute}.{index}."

    def n_blocks(self, config: dict, kind: str | None) -> int:
        k = self.kind(kind)
        return int(self.init_args(config)[k.count_key])

    # ----- config ----------------------------------------------------------------------------
    def init_args(self, config: dict) -> dict[str, Any]:
        """The model's __init__ arguments: its defaults overridden by config.json."""
        params = inspect.signature(self.model_class.__init__).parameters
        args = {n: p.default for n, p in params.items() if n != "self" and p.default is not p.empty}
        args.update({k: v for k, v in config.items() if k in params})
        return args

    def check_value_types(self, config: dict) -> None:
        """One line for a config.json value that is not a number where the model takes one (``"two"`` heads):
        diffusers would fail with a TypeError deep inside the model's constructor. Lists pass (some counts take
        a per-axis tuple), as does null (the model's own default then applies or it rejects it itself)."""
        params = inspect.signature(self.model_class.__init__).parameters
        for key, value in config.items():
            p = params.get(key)
            if p is None or isinstance(p.default, bool) or not isinstance(p.default, (int, float)):
                continue
            if value is None or isinstance(value, (list, tuple)):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise DitprofError(f"config.json: {key} is {value!r}, but {self.model_class.__name__} takes a "
                                   f"number there (default {p.default!r})")

    def heads(self, config: dict) -> tuple[int, int]:
        a = self.init_args(config)
        return int(a["num_attention_heads"]), int(a["attention_head_dim"])

    def dim(self, config: dict) -> int:
        heads, head_dim = self.heads(config)
        return heads * head_dim

    def build_block(self, config: dict, kind: str | None) -> torch.nn.Module:
        """Build one block with the parent model's constructor arguments (call under a device ctx). A captured
        family takes it from the model's own constructor (a one-block model), so no argument can drift."""
        if self.captured:
            return self.stack(self._one_block_model(config, kind), kind)[0]
        raise NotImplementedError

    # ----- inputs ----------------------------------------------------------------------------
    def patch_size(self, config: dict) -> tuple[int, int, int]:
        """(time, height, width) patch size of the patch embedding."""
        raise NotImplementedError

    def vae_strides(self, config: dict) -> tuple[int, int, int]:
        """(time, height, width) compression of the VAE whose latents this config's model takes."""
        return self.vae_stride

    def grid_from_size(self, config: dict, height: int, width: int, frames: int | None) -> LatentGrid:
        """Token grid for a pixel-space video/image size (VAE stride, then patchify)."""
        st, sh, sw = self.vae_strides(config)
        pt, ph, pw = self.patch_size(config)
        if self.is_video:
            frames = 1 if frames is None else frames
            latent_frames = (frames - 1) // st + 1  # causal video VAEs keep the first frame
        else:
            latent_frames = 1
        grid = LatentGrid(
            frames=math.ceil(latent_frames / pt), height=height // (sh * ph), width=width // (sw * pw)
        )
        if min(grid.frames, grid.height, grid.width) < 1:
            raise DitprofError(f"size {height}x{width}x{frames} is too small for {self.name} (no tokens)")
        return grid

    def grid_from_tokens(self, tokens: int) -> LatentGrid:
        """A plausible (frames, height, width) grid holding exactly ``tokens`` tokens.

        RoPE needs 3-D positions, so the count is factored into the most cube-like grid (images:
        the most square one), which keeps every axis inside the model's rotary table.
        """
        if tokens < 1:
            raise DitprofError(f"tokens must be positive, got {tokens}")
        best = None
        for f in _divisors(tokens) if self.is_video else (1,):
            rest = tokens // f
            for h in _divisors(rest):
                if h * h > rest:
                    break
                w = rest // h
                key = (max(f, h, w), -min(f, h, w))
                if best is None or key < best[0]:
                    best = (key, LatentGrid(f, h, w))
        grid = best[1]
        if self.max_axis_tokens and max(grid.frames, grid.height, grid.width) > self.max_axis_tokens:
            raise DitprofError(
                f"{tokens} tokens do not factor into a {self.name} grid with every axis <= "
                f"{self.max_axis_tokens}; pick a token count with more factors or give height/width/frames"
            )
        return grid

    def build_inputs(
        self,
        config: dict,
        kind: str | None,
        grid: LatentGrid,
        text_tokens: int,
        batch: int,
        gen: torch.Generator,
        device: torch.device,
        dtype: torch.dtype,
        parents: dict[str, torch.nn.Module] | None = None,
    ) -> tuple[tuple, dict]:
        """(args, kwargs) for ``block.forward``, shaped as the parent model passes them. ``parents``: the
        ``input_modules`` with their weights (None on the meta device: build them there)."""
        if self.captured:
            call = self.model_inputs(config, grid, text_tokens, batch, gen, device, dtype)
            return (), self.capture_block_inputs(config, kind, parents, call, device, dtype)
        raise NotImplementedError

    def plan(self, kind: str | None) -> BlockPlan:
        """The block's input/output plan (see ``BlockPlan``); families override it."""
        return BlockPlan()

    def output_index(self, kind: str | None) -> int | None:
        """Where the image/video hidden states sit in the block's output (None: a bare tensor)."""
        return self.plan(kind).output_index

    def input_modules(self, config: dict, kind: str | None) -> dict[str, torch.nn.Module]:
        """Modules of the parent model (not of the block) whose outputs the block's inputs are, by the model's
        attribute name: their weights are read with the block (e.g. MiniMax-H3's ``time_embedder``). Built on the
        current device context (the loader calls it under ``torch.device("meta")``)."""
        return self.captured_modules(config, kind) if self.captured else {}

    # ----- inputs captured from the model's own forward --------------------------------------
    # A family whose forward prepares many block inputs (several streams, masks, reordered text) declares
    # ``captured = True``: the block's inputs are then what the model's own ``forward`` hands its first block of
    # the stack, called with ``model_inputs`` on a shell of the model -- every stack emptied, the block replaced by
    # a placeholder that stops the forward -- whose modules before the blocks (``input_modules``) carry the
    # checkpoint's weights.
    captured: bool = False
    output_children: tuple[str, ...] = ()  # modules only the output path after the blocks uses

    def unused_children(self, kind: str | None) -> tuple[str, ...]:
        """Modules the forward runs before the blocks whose output the ``kind`` stack never reads."""
        return ()

    def _one_block_model(self, config: dict, kind: str | None) -> torch.nn.Module:
        """The model built with every stack emptied but one block in ``kind``'s (current device ctx)."""
        self.check_config(config)
        cfg = dict(config)
        for k in self.kinds:
            cfg[k.count_key] = 0
        cfg[self.kind(kind).count_key] = 1
        return self.model_class.from_config(cfg)

    def _shell(self, config: dict, kind: str | None) -> torch.nn.Module:
        """The one-block model with its block replaced by the placeholder that stops the forward."""
        model = self._one_block_model(config, kind)
        self.stack(model, kind)[0] = _StopAtBlock()
        return model

    def check_config(self, config: dict) -> None:
        """One-line error for a config option the adapter does not support (families override it)."""

    def captured_modules(self, config: dict, kind: str | None) -> dict[str, torch.nn.Module]:
        """The shell's top-level modules with weights that run before the blocks."""
        return self._before_blocks(self._shell(config, kind), kind)

    def _before_blocks(self, shell: torch.nn.Module, kind: str | None) -> dict[str, torch.nn.Module]:
        stacks = {k.attribute.split(".")[0] for k in self.kinds}
        skip = stacks | set(self.output_children) | set(self.unused_children(kind))
        return {n: m for n, m in shell.named_children()
                if n not in skip and any(True for _ in m.parameters())}

    def capture_block_inputs(self, config: dict, kind: str | None, parents: dict[str, torch.nn.Module] | None,
                             call: dict, device, dtype: torch.dtype | None = None) -> dict:
        """The block's inputs by name, as the model's own forward hands them to its first ``kind`` block, called
        with ``call`` (``model_inputs``); ``parents``: ``captured_modules`` with weights (None on meta)."""
        device = torch.device(device)
        from accelerate import init_empty_weights

        with init_empty_weights(include_buffers=False):  # weights on meta; buffers (RoPE tables) computed for real
            shell = self._shell(config, kind)
        for module in shell.modules():
            for name, buf in list(module._buffers.items()):
                if buf is not None:
                    module._buffers[name] = buf.to(device)
        if not parents:  # None, or a LoadedBlock built without them (the meta-device estimate)
            if device.type != "meta":
                raise DitprofError(f"{self.name} block inputs need the model's modules before the blocks "
                                   f"({', '.join(self._before_blocks(shell, kind))})")
            # the shell's own modules, their weights already on meta, in the dtypes the loader would give them
            for name, module in self._before_blocks(shell, kind).items():
                for pname, p in module.named_parameters():
                    p.data = p.data.to(self.tensor_dtype(f"{name}.{pname}", dtype) or p.dtype)
        else:
            for name, module in parents.items():
                setattr(shell, name, module)
        for name in self.unused_children(kind):
            setattr(shell, name, _Unused())
        try:
            with torch.no_grad():
                shell(**call)
        except _BlockReached as reached:
            bound = inspect.signature(self.block_class(kind).forward).bind(None, *reached.args, **reached.kwargs)
            return {k: v for k, v in bound.arguments.items() if k != "self"}
        raise DitprofError(f"{self.name}: the model's forward never reached a {self.kind(kind).name} block")

    def rows(self, grid: LatentGrid, kind: str | None) -> int:
        """Rows of the hidden states the block of stack ``kind`` sees for ``grid``."""
        return grid.tokens

    def stream_rows(self, config: dict, text_tokens: int, kind: str | None) -> int:
        """Rows of the separate text stream the block sees for a prompt of ``text_tokens`` (0: none)."""
        return text_tokens if self.text_stream(kind) else 0

    def masks_positions(self, config: dict, text_tokens: int) -> str | None:
        """Why the block's attention mask masks positions, for the report (None: the masks keep every key)."""
        return None

    def text_stream(self, kind: str | None) -> bool:
        """Whether the block takes the prompt as a separate input (False: text rows are packed into the hidden
        states, or there is no text)."""
        return True

    def model_inputs(self, config: dict, grid: LatentGrid, text_tokens: int, batch: int, gen: torch.Generator,
                     device: torch.device, dtype: torch.dtype) -> dict:
        """Keyword arguments of the whole model's ``forward`` for a latent of ``grid`` tokens, as its pipeline
        passes them (the whole-step estimate times the model's non-block modules with these)."""
        raise DitprofError(f"whole-step inputs for family {self.name!r} are not known")

    # ----- layouts ---------------------------------------------------------------------------
    def layout_from_tokens(self, config: dict, tokens: int, text_tokens: int) -> LatentGrid:
        """The grid for ``--tokens`` (a packed family spreads the rows over its modalities)."""
        return self.grid_from_tokens(tokens)

    def layout_from_size(self, config: dict, height: int, width: int, frames: int | None,
                         text_tokens: int) -> LatentGrid:
        return self.grid_from_size(config, height, width, frames)

    def pixel_size(self, config: dict, layout: LatentGrid) -> tuple[int, int, int]:
        """(height, width, frames) in pixels that a layout made by ``layout_from_size`` stands for: the size a
        request becomes after the rounding to whole VAE latents and patches, i.e. the size the blocks see."""
        st, sh, sw = self.vae_strides(config)
        pt, ph, pw = self.patch_size(config)
        frames = (layout.frames * pt - 1) * st + 1 if self.is_video else 1
        return layout.height * sh * ph, layout.width * sw * pw, frames

    def size_rule(self, config: dict) -> str:
        """The pixel sizes ``pixel_size`` keeps unchanged, in words (for the note on a rounded size)."""
        st, sh, sw = self.vae_strides(config)
        pt, ph, pw = self.patch_size(config)
        multiples = f"{sh * ph}" if sh * ph == sw * pw else f"{sh * ph} and {sw * pw}"
        rule = f"height and width in multiples of {multiples} (VAE {sh} x patch {ph})"
        if not self.is_video:
            return rule + ", one frame (an image model)"
        frames = f"{st}n + 1 frames" + (f" with n + 1 a multiple of {pt} (patch {pt})" if pt > 1 else "")
        return f"{rule}, {frames}"


def _divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order (O(sqrt n): a token count of 10^9 factors in milliseconds)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def rms_weight(norm: torch.nn.Module | None, head_dim: int, like: torch.Tensor,
               heads: int = 1) -> tuple[torch.Tensor, float]:
    """(weight (1, D), eps) of a per-head RMSNorm (torch's ``nn.RMSNorm`` or diffusers' ``RMSNorm``), ones where it
    has no weight; a one-line error for any other norm (the fused prologue computes an RMSNorm only). ``heads`` > 1:
    a norm across all heads (weight (heads * D,)), its weight viewed (heads, D)."""
    from diffusers.models.normalization import RMSNorm

    if not isinstance(norm, (torch.nn.RMSNorm, RMSNorm)):
        raise DitprofError(f"the fused prologue computes an RMSNorm; this processor's norm is "
                           f"{type(norm).__name__}")
    w = getattr(norm, "weight", None)
    if w is None:
        w = torch.ones(heads * head_dim, device=like.device, dtype=like.dtype)
    if w.shape != (heads * head_dim,):
        what = "per head" if heads == 1 else f"across {heads} heads"
        raise DitprofError(f"the fused prologue's RMSNorm is {what} ({heads * head_dim}); this one normalizes "
                           f"{tuple(w.shape)}")
    eps = norm.eps if norm.eps is not None else torch.finfo(like.dtype).eps
    return w.view(heads, head_dim), float(eps)


class PrologueWeights:
    """The fused prologue's norm weights of each attention module -- (G, D) for q and k, rows in the order of the
    norms given (a joint sequence: the text stream's first) -- and the eps, made once and remade only when a weight
    changes: the same tensors call after call (the FP8 launch's graph-replay key; no per-call ``torch.cat``). Under
    torch.compile they are built in the graph instead (dynamo does not trace pointers). ``heads`` > 1: one norm
    each for q and k across all heads, its weight (heads, D) (``rms_weight``)."""

    def __init__(self):
        self._cache: dict = {}

    def __call__(self, attn, norms_q, norms_k, head_dim: int, like: torch.Tensor, heads: int = 1):
        if torch.compiler.is_compiling():
            return self._build(norms_q, norms_k, head_dim, like, heads)
        stamp = tuple((id(n), None if getattr(n, "weight", None) is None else _weight_stamp(n.weight))
                      for n in (*norms_q, *norms_k))
        hit = self._cache.get(id(attn))
        if hit is None or hit[0] != stamp:
            hit = self._cache[id(attn)] = (stamp, self._build(norms_q, norms_k, head_dim, like, heads))
        return hit[1]

    @staticmethod
    def _build(norms_q, norms_k, head_dim, like, heads=1):
        qs = [rms_weight(n, head_dim, like, heads) for n in norms_q]
        ks = [rms_weight(n, head_dim, like, heads) for n in norms_k]
        eps = sorted({e for _, e in qs + ks})
        if len(eps) != 1:  # the prologue has one eps for every row of q and k
            raise DitprofError(f"the fused prologue takes one RMSNorm eps; this attention's q/k norms have {eps}")
        cat = (lambda ws: ws[0] if len(ws) == 1 else torch.cat(ws))  # noqa: E731
        return cat([w for w, _ in qs]), cat([w for w, _ in ks]), eps[0]


def version_of(t: torch.Tensor):
    """A tensor's version counter; None for an inference-mode tensor, which has none (one made under
    ``torch.inference_mode`` is taken as fixed once made: told apart by its storage or identity only)."""
    return None if t.is_inference() else t._version


def _weight_stamp(w: torch.Tensor) -> tuple:
    """What says a norm weight changed: its storage and version counter."""
    return (w.data_ptr(), version_of(w))


class PrologueTables:
    """The fused prologue's RoPE table over a joint sequence whose last ``rest`` rows get no rotation: the model's
    (cos, sin) (S, R) above ``rest`` rows of cos = 1, sin = 0, float32 (the prologue's table dtype). Those rows
    come out as the norm alone: n * 1 + rotate(n) * 0 = n in fp32, bit for bit but for the sign of a zero. The
    table is kept with the tensors it was made from (held, so their memory is not reused while the entry lives)
    and remade when they, their version or ``rest`` change: the same tensor call after call (the FP8 launch's
    graph-replay key). Under torch.compile it is built in the graph instead."""

    def __init__(self):
        self._hit: tuple | None = None  # (cos, sin, versions, rest, (table cos, table sin))

    def __call__(self, cos: torch.Tensor, sin: torch.Tensor, rest: int):
        if torch.compiler.is_compiling():
            return self._build(cos, sin, rest)
        hit = self._hit
        versions = (version_of(cos), version_of(sin))
        if hit is None or hit[0] is not cos or hit[1] is not sin or hit[2] != versions or hit[3] != rest:
            hit = self._hit = (cos, sin, versions, rest, self._build(cos, sin, rest))
        return hit[4]

    @staticmethod
    def _build(cos, sin, rest):
        if cos.dim() != 2 or cos.shape != sin.shape:
            raise DitprofError(f"the fused prologue takes a RoPE table (S, R) as cos and sin, got "
                               f"{tuple(cos.shape)} and {tuple(sin.shape)}")
        R = cos.shape[1]
        ones = torch.ones(rest, R, device=cos.device, dtype=torch.float32)
        return torch.cat([cos.float(), ones]), torch.cat([sin.float(), torch.zeros_like(ones)])


class PrologueProcessor:
    """Base of a family's fused-prologue processor: ``attend`` (harness.swaps.prologue) takes the raw projections;
    ``weights`` makes the norm weights once per attention module."""

    def __init__(self, attend: Callable):
        self.attend = attend
        self.weights = PrologueWeights()
        self.tables = PrologueTables()


def randn(shape, gen: torch.Generator, device, dtype, std: float = 1.0) -> torch.Tensor:
    """Seeded normal tensor drawn on CPU (so values match across devices), then moved (meta: shapes only)."""
    if torch.device(device).type == "meta":
        return torch.empty(shape, device="meta", dtype=dtype)
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * std).to(device=device, dtype=dtype)


def shape_only(shape, device) -> torch.Tensor:
    """A tensor with the given shape that costs one element: rotary modules read only the shape."""
    return torch.empty((1,) * len(shape), device=device).expand(*shape)
