"""``--sp P``: Ulysses sequence parallelism on CPU with gloo and 2 spawned ranks (CI).

Correctness: the gathered SP block output equals the single-device output of the same block, backend and
inputs. In fp32 the SP run does the same ops on row subsets, so only accumulation order could differ
(bound 1e-5 rel-RMS; measured 0 on CPU). Report fields per rank, traces per rank, bad input.
"""

import dataclasses
import gzip
import json

import pytest
import torch

from ditprof import cli
from ditprof.errors import DitprofError
from ditprof.harness.trace import categories as C
from ditprof.harness.sp import distributed
from ditprof.harness.sp import launch as SP
from ditprof.harness.run.runner import spec_from_args

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _spec(_, *argv):
    """RunSpec from a command line through the harness's own parser (independent of other layers)."""
    import argparse

    from ditprof.harness.cli import commands

    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    return spec_from_args(parser.parse_args(list(argv)), argv[0])


@pytest.fixture(scope="module")
def sp_run(tmp_path_factory):
    """h3-mini (MiniMax-H3, 4 heads x 128), 256 packed rows, fp32, sdpa -> fp8-emulated, 2 ranks: hidden rows,
    their AdaLN indices and RoPE rows sharded (the model's own _cp_plan splits), temb replicated."""
    out = tmp_path_factory.mktemp("sp") / "run"
    spec = _spec(None, "compare", "--preset", "h3-mini", "--device", "cpu", "--sp", "2", "--tokens", "256",
                 "--iters", "2", "--warmup", "1", "--out", str(out), "--blocks", "40")
    spec = dataclasses.replace(spec, dtype=torch.float32)
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per rank on the 2-core CI box
    try:
        rep, folder = SP.execute_sp(spec)
    finally:
        torch.set_num_threads(n)
    assert folder == out.absolute()
    return out, rep


def test_sp_matches_single_device(sp_run):
    _, rep = sp_run
    sp = rep["sp"]
    assert sp["degree"] == 2 and sp["strategy"] == "ulysses" and sp["process_group_backend"] == "gloo"
    assert sp["tokens_per_rank"] == 128 and sp["heads_per_rank"] == 2 and sp["cross_attention"] == "local"
    assert sp["environment"] == distributed.MULTICAST_OFF_ENV
    for label in ("baseline", "swapped"):
        chk = sp["check"][label]
        assert chk["tolerance"] == 1e-5
        assert chk["block_output_rel_rms"] <= 1e-5, (label, chk)
        assert chk["block_output_cosine"] > 1 - 1e-9 and chk["passed"] and chk["finite"]
    # no cross-attention in MiniMax-H3: the chunked reference is the plain single-device run
    assert sp["check"]["baseline"]["vs_unchunked_rel_rms"] <= 1e-5
    assert sp["check"]["swapped"]["vs_unchunked_rel_rms"] <= 1e-5
    assert sp["check_passed"]
    acc = rep["accuracy"]
    assert 0 < acc["block_output_rel_rms"] < 0.1  # fp8 numerics vs sdpa, both gathered


def test_sp_report_per_rank(sp_run):
    out, rep = sp_run
    assert rep["model"]["tokens"] == 256 and rep["model"]["heads"] == 4
    assert rep["settings"]["rank_devices"] == ["cpu", "cpu"]
    for label, backend in (("baseline", "sdpa"), ("swapped", "fp8-emulated")):
        sec = rep[label]
        assert sec["attention_backend"] == backend and sec["route"] == "dispatcher"
        assert sec["attention_modules"] == {"attn": f"ulysses-{backend}"}
        assert sec["diffusers_backends"]["attn"] == "ditprof_ulysses_" + backend.replace("-", "_")
        ranks = sec["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        for r in ranks:
            assert len(r["samples_ms"]) == rep["settings"]["iters"]
            assert 0 < r["block_ms"]["min"] <= r["block_ms"]["median"] <= r["block_ms"]["max"]
            assert set(r["split_ms"]) == set(C.ALL_CATEGORIES)
            assert r["split_ms"]["communication"] > 0 and r["split_ms"]["attention"] > 0
            assert r["trace"] == f"rank{r['rank']}.{label}.trace.json.gz"
            assert r["tb_trace"].startswith(f"tb/{label}/rank{r['rank']}.{label}.")
        slow = max(ranks, key=lambda r: r["block_ms"]["median"])
        assert sec["rank"] == slow["rank"] == rep["sp"]["slowest_rank"][label]
        assert sec["block_ms"] == slow["block_ms"]
        per_call = [max(a, b) for a, b in zip(ranks[0]["samples_ms"], ranks[1]["samples_ms"])]
        assert sec["samples_ms_max_over_ranks"] == pytest.approx(per_call)
        assert sec["block_ms_max_over_ranks"]["max"] == pytest.approx(max(per_call))
        assert sum(sec["split_ms"].values()) == pytest.approx(sec["split_total_ms"])
        assert 0 < sec["attention_share"] < 1
    ex = rep["extrapolation"]
    assert ex["n_blocks"] == 40 and "slowest rank" in ex["uses"]
    assert ex["baseline_ms"] == pytest.approx(rep["baseline"]["block_ms"]["median"] * 40)
    assert ex["swapped_ms"] == pytest.approx(rep["swapped"]["block_ms"]["median"] * 40)
    md = (out / "report.md").read_text()
    assert "Ulysses over 2 ranks" in md and "communication" in md and "rank 1: block median" in md
    assert (out / "split.png").read_bytes()[:8] == PNG_MAGIC


def test_sp_traces_per_rank(sp_run):
    out, rep = sp_run
    for label in ("baseline", "swapped"):
        for r in (0, 1):
            with gzip.open(out / f"rank{r}.{label}.trace.json.gz", "rt") as f:
                trace = json.load(f)
            names = {e.get("name") for e in trace["traceEvents"]}
            assert {C.BLOCK_RANGE, C.ATTENTION_RANGE, C.COMM_RANGE + "/qkv", C.COMM_RANGE + "/out"} <= names
            info = trace["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (r, 2, "gloo")
        tb = sorted((out / "tb" / label).glob("*.pt.trace.json"))
        assert [p.name.split(".")[0] for p in tb] == ["rank0", "rank1"]
        for r, p in enumerate(tb):
            assert json.loads(p.read_text())["distributedInfo"]["rank"] == r
    for f in rep["files"]:
        assert (out / f).is_file(), f
    assert not [p for p in out.rglob(".*")]  # no staging, rank scratch or error files left
    assert not [p for p in out.parent.iterdir() if p.name != out.name]


def test_sp_tb_loads_in_hta(sp_run):
    hta = pytest.importorskip("hta.trace_analysis")
    out, _ = sp_run
    analysis = hta.TraceAnalysis(trace_dir=str(out / "tb" / "baseline"))
    assert sorted(analysis.t.traces) == [0, 1]


def test_sp_cross_heads_is_exact_for_fp8(tmp_path):
    """The head-split cross-attention gives FP8 the single-device per-head scales: exact vs one device."""
    out = tmp_path / "heads"
    spec = _spec(None, "profile", "--preset", "wan-tiny", "--device", "cpu", "--sp", "2", "--attention",
                 "fp8-emulated", "--iters", "1", "--warmup", "1", "--out", str(out))
    spec = dataclasses.replace(spec, dtype=torch.float32, sp_cross="heads")
    rep, _ = SP.execute_sp(spec)
    assert rep["swapped"] is None
    sec = rep["baseline"]
    assert sec["attention_modules"] == {"attn1": "ulysses-fp8-emulated", "attn2": "ulysses-heads-fp8-emulated"}
    chk = rep["sp"]["check"]["baseline"]
    assert chk["block_output_rel_rms"] <= 1e-5 and "vs_unchunked_rel_rms" not in chk
    trace = json.loads(gzip.open(out / "rank1.baseline.trace.json.gz", "rt").read())
    assert C.COMM_RANGE + "/q" in {e.get("name") for e in trace["traceEvents"]}


# --------------------------------------------------------------------------- bad input (no ranks started)

@pytest.mark.parametrize("argv, words", [
    (["--preset", "h3-mini", "--sp", "3"], ["head count 4 is not divisible by 3", "token count 2048"]),
    (["--preset", "h3-mini", "--sp", "8", "--tokens", "1024"], ["head count 4 is not divisible by 8"]),
    (["--preset", "wan-tiny", "--sp", "2", "--tokens", "49"], ["token count 49 is not divisible by 2"]),
    (["--preset", "cogvideox-tiny", "--sp", "4"], ["head count 2 is not divisible by 4"]),
    (["--preset", "wan-tiny", "--sp", "2", "--attention", "nope"], ["unknown attention backend 'nope'"]),
])
def test_sp_bad_input(tmp_path, argv, words):
    out = tmp_path / "bad"
    spec = _spec(None, "compare", "--device", "cpu", "--out", str(out), *argv)
    with pytest.raises(DitprofError) as e:
        SP.execute_sp(spec)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    if "token count 49" in words[0]:
        assert "head count" not in msg  # says which one
    assert not out.exists() and not list(tmp_path.iterdir())


def test_sp_below_one_and_more_ranks_than_gpus(monkeypatch):
    with pytest.raises(DitprofError, match="--sp must be >= 1"):
        _spec(None, "profile", "--preset", "wan-tiny", "--device", "cpu", "--sp", "0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(DitprofError, match=r"--sp 4 needs 4 GPUs .* 2 are visible \(CUDA_VISIBLE_DEVICES=0,1\)"):
        SP.check_degree(4, device=torch.device("cuda"))
    SP.check_degree(2, heads=4, tokens=6, device=torch.device("cuda"))


def test_cli_sp_error_is_one_line(capsys):
    rc = cli.main(["profile", "--preset", "h3-mini", "--device", "cpu", "--sp", "3"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "not divisible by 3" in err and "Traceback" not in err


# --------------------------------------------------------------------------- pieces, in-process

def test_communication_category():
    assert C.category_for_stack([C.BLOCK_RANGE, C.ATTENTION_RANGE, C.COMM_RANGE + "/qkv", "aten::copy_"]) == \
        "communication"
    assert C.category_for_stack([C.BLOCK_RANGE, C.ATTENTION_RANGE, "c10d::alltoall_base_"]) == "communication"
    assert C.category_for_stack([C.BLOCK_RANGE, "nccl:all_to_all"]) == "communication"
    assert C.category_for_kernel_name("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == \
        "communication"
    assert C.category_for_stack([C.BLOCK_RANGE, C.ATTENTION_RANGE, "aten::bmm"]) == "attention"


def test_ulysses_wrapper_world_one(tmp_path):
    """The regroup and the wrapper on a 1-rank gloo group (the P=1 path): identity around the backend."""
    import torch.distributed as dist

    from ditprof.kernels import registry

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 24, 4, 8, generator=g) for _ in range(3))
        kt = torch.randn(1, 5, 4, 8, generator=g)
        (qh,) = distributed.seq_to_heads([q], 1)
        assert torch.equal(qh, q) and torch.equal(distributed.heads_to_seq(qh, 1), q)
        inner = registry.get("sdpa").fn
        assert torch.equal(SP.ulysses_backend(inner, 1)(q, k, v), inner(q, k, v))
        assert torch.equal(SP.cross_heads_backend(inner, 1, 0)(q, kt, kt), inner(q, kt, kt))
        assert torch.equal(SP.query_chunked(inner, 3)(q, kt, kt), inner(q, kt, kt))
    finally:
        dist.destroy_process_group()


def test_regroup_layout_without_a_group(monkeypatch):
    """seq_to_heads / heads_to_seq with a fake 2-rank all-to-all: rank r gets heads r*H/P.., all tokens in
    rank order; the inverse restores the shards (both ranks simulated in one process)."""
    import torch.distributed as dist

    g = torch.Generator().manual_seed(1)
    full = torch.randn(1, 6, 4, 3, generator=g)  # S=6, H=4
    shards = [full[:, :3], full[:, 3:]]
    sends: dict[int, torch.Tensor] = {}

    def run(rank, fn, arg):
        monkeypatch.setattr(dist, "all_to_all_single", lambda recv, send, group=None: (
            sends.__setitem__(rank, send.clone()), recv.copy_(send)))
        return fn(arg)

    # phase 1: every rank's send buffer
    for r in (0, 1):
        run(r, lambda x: distributed.seq_to_heads([x], 2), shards[r])
    for r in (0, 1):
        recv = torch.stack([sends[j][r] for j in (0, 1)])  # rank r receives chunk r of every rank
        monkeypatch.setattr(dist, "all_to_all_single", lambda out, send, group=None, rr=recv: out.copy_(rr))
        (got,) = distributed.seq_to_heads([shards[r]], 2)
        assert torch.equal(got, full[:, :, 2 * r:2 * r + 2])
    heads = [full[:, :, 0:2], full[:, :, 2:4]]
    for r in (0, 1):
        run(r, lambda x: distributed.heads_to_seq(x, 2), heads[r])
    for r in (0, 1):
        recv = torch.stack([sends[j][r] for j in (0, 1)])
        monkeypatch.setattr(dist, "all_to_all_single", lambda out, send, group=None, rr=recv: out.copy_(rr))
        assert torch.equal(distributed.heads_to_seq(heads[r], 2), shards[r])


def test_sp_rank_side_error_is_one_message(tmp_path):
    """A checkpoint is only inspected inside the ranks: their DitprofError comes back as one message and the
    run leaves nothing behind."""
    from ditprof.model_blocks import get_preset, make_checkpoint

    ckpt, _ = make_checkpoint(get_preset("cogvideox-tiny"), tmp_path / "ckpt", blocks=None, progress=False)
    out = tmp_path / "runs" / "bad"
    spec = _spec(None, "profile", "--checkpoint", str(ckpt), "--device", "cpu", "--sp", "2", "--tokens", "47",
                 "--iters", "1", "--out", str(out))
    with pytest.raises(DitprofError) as e:
        SP.execute_sp(spec)
    assert "token count 47 is not divisible by 2" in str(e.value) and "Traceback" not in str(e.value)
    runs = tmp_path / "runs"  # created on the way: removed again (a failed run leaves no empty folder)
    assert not out.exists() and not (runs.exists() and list(runs.iterdir()))


# --------------------------------------------------------------------------- other families

def _family_run(tmp_path, preset, *extra, attention="sdpa"):
    out = tmp_path / preset
    spec = _spec(None, "profile", "--preset", preset, "--device", "cpu", "--sp", "2", "--attention", attention,
                 "--iters", "1", "--warmup", "1", "--out", str(out), *extra)
    spec = dataclasses.replace(spec, dtype=torch.float32)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rep, _ = SP.execute_sp(spec)
    finally:
        torch.set_num_threads(n)
    chk = rep["sp"]["check"]["baseline"]
    assert chk["tolerance"] == 1e-5 and chk["block_output_rel_rms"] <= 1e-5 and chk["passed"], chk
    assert rep["sp"]["tokens_per_rank"] * 2 == rep["model"]["tokens"]
    return rep


def test_sp_wan_local_cross_attention(tmp_path):
    """Wan: video tokens and their (1, S, 1, hd) RoPE rows sharded; cross-attention to the replicated text
    runs locally on each rank's queries (sdpa rows are independent: exactly the unchunked run)."""
    rep = _family_run(tmp_path, "wan-tiny")
    assert rep["baseline"]["attention_modules"] == {"attn1": "ulysses-sdpa", "attn2": "sdpa"}
    assert rep["sp"]["check"]["baseline"]["vs_unchunked_rel_rms"] <= 1e-5


def test_sp_minimax_h3_refiner(tmp_path):
    """The MiniMax-H3 text refiner: plain self-attention over the prompt rows, sharded."""
    rep = _family_run(tmp_path, "minimax-h3-tiny", "--kind", "refiner")
    assert rep["baseline"]["attention_modules"] == {"attn": "ulysses-sdpa"}
    assert rep["model"]["tokens"] == 8  # the refiner sees the layout's 8 prompt rows only


def test_sp_ltx_video(tmp_path):
    """LTX-Video: video tokens and the matching (B, S, D) cos/sin rows sharded, text and temb replicated."""
    rep = _family_run(tmp_path, "ltx-video-tiny")
    assert rep["baseline"]["attention_modules"] == {"attn1": "ulysses-sdpa", "attn2": "sdpa"}


@pytest.mark.parametrize("preset", ["flux-tiny", "hunyuan-video-tiny", "flux2-tiny"])
@pytest.mark.parametrize("kind, attention", [("double", "fp8-emulated"), ("single", "sdpa")])
def test_sp_joint_attention(tmp_path, preset, kind, attention):
    """Flux ([text, image]) and HunyuanVideo ([image, text], bool mask): image tokens sharded, text
    replicated; joint attention regroups only the image part (per-head FP8 scales see all T + S tokens of
    their heads, so even fp8-emulated matches one device)."""
    rep = _family_run(tmp_path, preset, "--kind", kind, attention=attention)
    assert rep["baseline"]["attention_modules"] == {"attn": f"ulysses-joint-{attention}"}


@pytest.mark.parametrize("attention", ["sdpa", "fp8-emulated"])
def test_sp_qwen_image(tmp_path, attention):
    """Qwen-Image ([text, image] joint attention with the prompt mask): image rows and their rotary freqs
    sharded, the text freqs and the prompt mask replicated; the joint mask over [text | local image] keeps every
    key for a full prompt and is dropped after that check."""
    rep = _family_run(tmp_path, "qwen-image-tiny", attention=attention)
    assert rep["baseline"]["attention_modules"] == {"attn": f"ulysses-joint-{attention}"}
    assert rep["baseline"]["attention_masks"]["dropped_all_attend"] >= 1


def test_sp_cogvideox(tmp_path):
    """CogVideoX ([text, video] joint attention, processor calls SDPA itself): video tokens and their RoPE
    rows sharded, text replicated; the joint wrapper goes in by processor replacement."""
    rep = _family_run(tmp_path, "cogvideox-tiny")
    assert rep["baseline"]["attention_modules"] == {"attn1": "ulysses-joint-sdpa"}
    assert rep["baseline"]["route"] == "processor"


def test_joint_wrapper_world_one(tmp_path):
    import torch.distributed as dist

    from ditprof.kernels import registry

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 24, 4, 8, generator=g) for _ in range(3))
        inner = registry.get("sdpa").fn
        for first in (True, False):
            assert torch.equal(SP.joint_ulysses_backend(inner, 1, 0, 5, first)(q, k, v), inner(q, k, v))
    finally:
        dist.destroy_process_group()


def test_sp_json_stdout_is_the_report_alone(tmp_path, capfd, monkeypatch):
    """--sp --json: rank 0's progress lines go to stderr with everything else; stdout parses as the report."""
    # spawned ranks write to this test's captured descriptors; forked from a forkserver an earlier test started,
    # they would write to the ones that server inherited
    monkeypatch.setenv("DITPROF_SP_START_METHOD", "spawn")
    assert cli.main(["compare", "--preset", "wan-tiny", "--device", "cpu", "--sp", "2", "--iters", "1",
                     "--warmup", "1", "--json", "--out", str(tmp_path / "run")]) == 0
    cap = capfd.readouterr()
    assert cap.out.startswith("{"), cap.out[:120]
    rep = json.loads(cap.out)
    assert rep["sp"]["degree"] == 2 and rep["extrapolation"]["speedup"] is None  # fp8-emulated: numerics only
    assert "rank 0 of 2: timing" in cap.err
