"""The plan printed before a run: FLOPs from the meta-device pass, refusals before anything is loaded."""

import json

from ditprof.cli import main
from ditprof.harness.run import plan as run_plan


def test_plan_counts_attention_flops_exactly(tmp_path, capsys):
    """wan-tiny at 48 tokens: self-attention 4*B*H*S*S*D + cross-attention to 8 text rows 4*B*H*S*T*D."""
    out = tmp_path / "run"
    assert main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--iters", "1", "--warmup", "1",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "plan: 48 rows" in printed and "plan: ~" in printed
    plan = json.loads((out / "report.json").read_text())["plan"]
    heads, head_dim, s, t = 2, 12, 48, 8
    assert plan["attention_flops"] == 4 * heads * s * s * head_dim + 4 * heads * s * t * head_dim
    assert plan["gemm_flops"] > 0 and plan["peak_bytes"] >= plan["block_bytes"] > 0
    assert plan["calls"] == 1 + 1 + round(2 * run_plan.PROFILER_FACTOR)


def test_plan_refuses_a_run_over_memory_or_time_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--tokens", "1000000000", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "more than the" in err[0] and "give a smaller size" in err[0], err
    rc = main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--tokens", "2000000", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "over the 15 min limit; pass --yes" in err[0], err
    rc = main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--tokens", "20000", "--time-limit", "0.001",
               "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "over the 0.001 min limit" in err[0], err
    assert not out.exists()
    rc = main(["profile", "--preset", "wan-tiny", "--device", "cpu", "--time-limit", "0", "--out", str(out)])
    assert rc == 2 and "--time-limit must be > 0" in capsys.readouterr().err
