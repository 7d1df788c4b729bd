"""The GPU error table's summary (benchmarks/truth_errors.py): errors keep their sign; roofline vs measured."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "truth_errors.py"
spec = importlib.util.spec_from_file_location("truth_errors", SCRIPT)
truth_errors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(truth_errors)


def row(alloc, oom=False, measured=None, roofline=None):
    return {"peak_allocated_err_pct": alloc, "peak_reserved_err_pct": None, "device_used_err_pct": None,
            "oom": oom, "measured_step_s": measured, "roofline_step_s": roofline}


def test_summary_keeps_the_sign_and_skips_oom_rows():
    rows = [row(-3.0, measured=0.2, roofline=0.1), row(1.0, measured=0.3, roofline=0.1), row(2.0),
            row(50.0, oom=True, measured=9.0, roofline=0.1)]
    s = truth_errors.summarize(rows)
    alloc = s["peak_allocated_err_pct"]
    # |-3|, |1|, |2| -> median 2, max 3; signed -3, 1, 2 -> median 1, most under -3, most over +2; the OOM row is out
    assert alloc == {"median_abs": 2.0, "max_abs": 3.0, "median": 1.0, "most_under": -3.0, "most_over": 2.0, "n": 3}
    assert "peak_reserved_err_pct" not in s
    # measured / roofline: 0.2/0.1 = 2, 0.3/0.1 = 3 -> median 2.5
    assert s["measured_over_roofline"] == {"median": 2.5, "min": 2.0, "max": 3.0, "n": 2}
