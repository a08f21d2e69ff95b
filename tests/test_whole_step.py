"""Whole denoising step: estimate math, and the model's own non-block modules really run."""

from __future__ import annotations

import pytest
import torch

from ditprof.errors import DitprofError
from ditprof.harness.validate import whole_step as W
from ditprof.harness.validate.source import open_source

TINY = ["wan-tiny", "flux-tiny", "hunyuan-video-tiny", "ltx-video-tiny", "cogvideox-tiny"]


def test_step_estimate_math():
    e = W.step_estimate(10.0, 50, 20.0, steps=30, cfg=True)
    assert e["block_part_ms"] == 500.0 and e["per_step_ms"] == 520.0
    assert e["block_share"] == pytest.approx(500 / 520)
    assert e["passes"] == 60 and e["per_video_ms"] == 520.0 * 60
    assert e["per_video_block_ms"] == 500.0 * 60 and e["per_video_rest_ms"] == 20.0 * 60
    assert e["per_video_block_ms"] + e["per_video_rest_ms"] == pytest.approx(e["per_video_ms"])
    e = W.step_estimate(10.0, 50, 20.0, steps=30)
    assert e["passes"] == 30 and e["per_video_ms"] == 520.0 * 30
    e = W.step_estimate(2.0, 4, 1.0)
    assert e["per_step_ms"] == 9.0 and e["passes"] is None and e["per_video_ms"] is None
    with pytest.raises(DitprofError):
        W.step_estimate(1.0, 0, 1.0)
    with pytest.raises(DitprofError):
        W.step_estimate(1.0, 2, 1.0, steps=0)


@pytest.mark.parametrize("name", TINY)
def test_rest_modules_really_run(name):
    src = open_source(name, "preset", None)
    r = W.measure_rest(src, device="cpu", iters=2, warmup=1)
    assert r["modules_not_run"] == []  # every module holding parameters ran
    assert r["config_overrides"] and all(v == 0 for v in r["config_overrides"].values())
    top = {n.split(".")[0] for n in r["modules_ran"]}
    assert top >= set(r["parts_ms"]) - {"rope", "pos_embed", "time_proj", "embedding_dropout"}
    assert {"norm_out", "proj_out"} <= top
    assert r["rest_ms"]["median"] > 0 and r["params"] > 0
    assert all(v >= 0 for v in r["parts_ms"].values())
    # no block stack is left in the model that ran
    model = W.build_rest_model(src, device="cpu")
    stacks = [src.family.stack(model, k.name) for k in src.family.kinds]
    assert all(len(s) == 0 for s in stacks)


def test_rest_model_uses_checkpoint_tensors():
    """Preset (generated) and checkpoint (read from the shards) rest weights are the same on CPU."""
    from ditprof.model_blocks import get_preset
    from ditprof.model_blocks.synthetic import ensure_checkpoint

    folder = ensure_checkpoint(get_preset("wan-tiny"), blocks=None, kind=None, progress=False)
    a = W.build_rest_model(open_source("wan-tiny", "preset", None), device="cpu").state_dict()
    b = W.build_rest_model(open_source(str(folder), "checkpoint", None), device="cpu").state_dict()
    assert a.keys() == b.keys() and len(a) > 4
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    # diffusers' fp32-kept modules (Wan's time embedder) stay fp32, the rest is bf16
    assert b["condition_embedder.time_embedder.linear_1.weight"].dtype == torch.float32
    assert b["proj_out.weight"].dtype == torch.bfloat16


def test_rest_input_matches_block_tokens():
    src = open_source("wan-tiny", "preset", None)
    grid, text = W.grid_and_text(src, tokens=24)
    kw = W.rest_inputs(src, grid, text, device="cpu", dtype=torch.bfloat16)
    pt, ph, pw = src.family.patch_size(src.config)
    x = kw["hidden_states"]
    assert (x.shape[2] // pt) * (x.shape[3] // ph) * (x.shape[4] // pw) == 24
    assert kw["encoder_hidden_states"].shape[1] == 8


def test_rest_input_of_a_packed_model_holds_the_block_rows():
    """MiniMax-H3: the model's forward gets video, audio and text rows that pack into the block's row count,
    with the pipeline's layout tensors; its output is the video rows."""
    src = open_source("h3-mini", "preset", None)
    grid, text = W.grid_and_text(src, tokens=256)
    kw = W.rest_inputs(src, grid, text, device="cpu", dtype=torch.bfloat16)
    rows = kw["hidden_states"].shape[1] + kw["audio_hidden_states"].shape[1] + kw["encoder_hidden_states"].shape[1]
    assert rows == 256 == kw["position_ids"].shape[0] == kw["token_tags"].shape[0]
    assert kw["encoder_hidden_states"].shape[1] == grid.text == 64  # a quarter of 256 rows at most
    model = W.build_rest_model(src, device="cpu")
    with torch.inference_mode():
        video, audio = model(**kw)
    assert video.shape == kw["hidden_states"].shape and audio.shape == kw["audio_hidden_states"].shape
