"""The rate model's arithmetic (benchmarks/rate_model.py), CPU only: no compile, synthetic loop counts; the
published numbers themselves are not tested."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "rate_model.py"


@pytest.fixture(scope="module")
def rm():
    spec = importlib.util.spec_from_file_location("ditprof_bench_rate_model", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _counts(rm, qk=32, pv=32, mufu=36, fp32=364, instr=648):
    per = 2 * 16 * 8 * 32
    return {"mma_ops": {"imma_s8": qk * per, "qmma_f32": pv * per}, "mufu": mufu, "fp32": fp32,
            "instructions": instr}


def test_tile_count_of_h3(rm):
    # 56 heads x ceil(30272 / 128) row blocks, ceil(30272 / 32) strips each
    assert rm.work_units(rm.H3, 128, 32) == (56 * 237, 946)
    assert rm.work_units((2, 3, 100, 64), 128, 32) == (6, 4)


def test_mma_ops_of_sass_forms(rm):
    assert rm.mma_ops("QMMA.16832.F32.E4M3.E4M3 R4, R8, R12, RZ") == ("qmma_f32", 8192)
    assert rm.mma_ops("QMMA.16832.F16.E4M3.E4M3 R4, R8, R12, RZ") == ("qmma_f16", 8192)
    assert rm.mma_ops("IMMA.16832.S8.S8.SAT R4, R8, R12, R4") == ("imma_s8", 8192)
    assert rm.mma_ops("HMMA.16816.F32.BF16 R4, R8, R12, R4") == ("hmma_bf16_f32", 4096)
    assert rm.mma_ops("IGMMA.64x160x32.S8.S8.SAT R24, gdesc[UR4], R24") == ("wgmma_int8", 2 * 64 * 160 * 32)
    assert rm.mma_ops("FFMA R1, R2, R3, R4") is None


def test_halving_a_rate_doubles_its_term(rm):
    rates = dict(rm.ARCH_RATES["sm_120"])
    base = rm.unit_cycles(_counts(rm), 4, rates)
    rates["qmma_f32"] = rm.Rate(rates["qmma_f32"].per_clk_sm / 2, "test")
    half = rm.unit_cycles(_counts(rm), 4, rates)
    pv = 32 * 8192 * 4
    assert half["tensor"] - base["tensor"] == pytest.approx(pv / rates["qmma_f32"].per_clk_sm / 2)
    assert half["mufu"] == base["mufu"] and half["issue"] == base["issue"]


def test_block_scaled_swap_prices_pv_at_its_rate(rm):
    rates = rm.ARCH_RATES["sm_120"]
    c = _counts(rm)
    shipped = rm.unit_cycles(c, 4, rates)
    sf = rm.unit_cycles(c, 4, rates, {"qmma_f32": "qmma_sf"})
    qk = 32 * 8192 * 4 / rates["imma_s8"].per_clk_sm
    pv = 32 * 8192 * 4
    assert shipped["tensor"] == pytest.approx(qk + pv / rates["qmma_f32"].per_clk_sm)
    assert sf["tensor"] == pytest.approx(qk + pv / rates["qmma_sf"].per_clk_sm)
    with pytest.raises(ValueError, match="qmma_sf"):
        rm.unit_cycles(c, 4, rm.ARCH_RATES["sm_89"], {"qmma_f32": "qmma_sf"})


def test_predict_overlap_serial_and_clock(rm):
    dev = rm.DEVICES["rtx5080"]
    cyc = {"tensor": 1000.0, "mufu": 200.0, "fp32": 300.0, "issue": 400.0}
    a = rm.predict_ms(cyc, 84 * 1000, dev, 84, 84, mhz=1000)
    # 1000 units per SM x 1000 cycles at 1 GHz = 1 ms
    assert a["tensor"] == pytest.approx(1.0) and a["overlap"] == pytest.approx(1.0)
    assert a["serial"] == pytest.approx(1.4)
    b = rm.predict_ms(cyc, 84 * 1000, dev, 84, 84, mhz=2000)
    assert b["overlap"] == pytest.approx(a["overlap"] / 2)


def test_wave_factor_and_residency(rm):
    assert rm.wave_factor(168 * 79, 168) == 1.0
    assert rm.wave_factor(13272, 340) == pytest.approx(40 / (13272 / 340))
    dev = rm.DEVICES["rtx5080"]
    assert rm.resident_ctas(dev, 128, 255, 33792) == 2  # 256 x 128 registers: two CTAs in 64K
    assert rm.resident_ctas(dev, 128, 64, 60 * 1024) == 1  # shared memory limits


def test_implied_rate_inverts_device_peak(rm):
    dev = rm.DEVICES["rtx4090"]
    peak = rm.device_peak_t("qmma_f32", dev)
    assert rm.implied_per_clk(peak, dev, None) == pytest.approx(rm.ARCH_RATES["sm_89"]["qmma_f32"].per_clk_sm)
    assert rm.implied_per_clk(peak, dev, dev.boost_mhz * 2) == pytest.approx(512)


def test_key_loop_and_counts_from_sass_text(rm):
    sass = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        ".L_x_1:",
        "        /*0010*/                   IMMA.16832.S8.S8.SAT R4, R8, R12, R4 ;",
        "        /*0020*/                   MUFU.EX2 R5, R6 ;",
        "        /*0030*/                   FFMA R5, R6, R7, R8 ;",
        "        /*0040*/                   QMMA.16832.F32.E4M3.E4M3 R4, R8, R12, RZ ;",
        "        /*0050*/              @P0 BRA `(.L_x_1) ;",
        "        /*0060*/                   STG.E [R2], R4 ;",
    ])
    c = rm.loop_counts(rm.key_loop(sass))
    assert c["instructions"] == 5 and c["mufu"] == 1 and c["fp32"] == 1
    assert c["mma_ops"] == {"imma_s8": 8192, "qmma_f32": 8192}


def test_calibration_applies_the_measured_fraction(rm):
    ms = {"tensor": 50.0, "mufu": 1.0, "fp32": 1.0, "issue": 1.0, "dram": 0.0, "overlap": 50.0, "serial": 51.0}
    rows = [{"device": "rtx5080", "kernel": "fp8-sm120", "pv_form": "as shipped (x)", "mhz": 2617, "ms": dict(ms)},
            {"device": "rtx5090", "kernel": "fp8-sm120", "pv_form": "other", "mhz": 2407,
             "ms": {**ms, "overlap": 25.0}}]
    rm.calibrate(rows)
    frac = 50.0 / rm.MEASURED["rtx5080"][0]
    assert rows[0]["achieved"] == pytest.approx(frac)
    assert rows[1]["predicted_ms"] == pytest.approx(25.0 / frac) and rows[1]["fraction_from"] == "rtx5080"
