"""prep_best_setting: which setting of an interleaved prep timing a GPU batch takes as the process default."""

from __future__ import annotations

from prep_best_setting import best_setting


def _result(rows: dict) -> dict:
    names = ["default", *rows]
    settings = {"default": {}, "fast": {"QK_ROWS": 256}, "faster_but_wrong": {"QK_BLOCK": 32},
                "lopsided": {"STATS_WARPS": 8, "QK_RECIP": False}}
    shapes = {}
    for shape in ("flux", "h3"):
        shapes[shape] = {"default": {"vs_default": 0.0, "check": None}}
        for name in rows:
            vs, check = rows[name][shape]
            shapes[shape][name] = {"vs_default": vs, "check": check}
    return {"meta": {"settings": {n: settings[n] for n in names}}, "shapes": shapes}


def test_the_fastest_correct_setting_wins():
    res = _result({"fast": {"flux": (-0.05, None), "h3": (-0.03, None)},
                   "faster_but_wrong": {"flux": (-0.20, "k8: max diff 3"), "h3": (-0.2, None)},
                   "lopsided": {"flux": (-0.30, None), "h3": (0.05, None)}})
    assert best_setting(res, 0.02, 0.01) == "QK_ROWS=256"
    # a loss at one shape above max_loss disqualifies; allowed, the lopsided setting wins
    assert best_setting(res, 0.02, 0.10) == "STATS_WARPS=8,QK_RECIP=False"


def test_no_setting_below_the_gain_threshold():
    res = _result({"fast": {"flux": (-0.01, None), "h3": (-0.005, None)}})
    assert best_setting(res, 0.02, 0.01) == ""
    assert best_setting(res, 0.005, 0.01) == "QK_ROWS=256"
