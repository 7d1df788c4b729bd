"""benchmarks/published_speed.py: predicted throughput against published measurements.

Fast: the corpus' throughput rows grouped by measurement (one run quoted by two documents counts once,
with the row that states more of its setting), the summary over measurements, and every stored result's
error recomputed from its stored numbers (the README table is what the results say).
Slow: one published row recomputed end to end against its stored prediction."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "published"))

import corpus  # noqa: E402
import published_speed as ps  # noqa: E402

RESULTS = json.loads((ROOT / "benchmarks" / "results" / "published_speed.json").read_text())


def _speed_rows():
    return [r for r in corpus.load_rows() if r["metric"] in ps.SPEED_METRICS and r["gpuwise_args"] is not None]


def test_one_run_quoted_twice_is_one_measurement_predicted_with_the_fuller_setting():
    groups = {g[0]["id"]: g for g in ps.group_measurements(_speed_rows())}
    g = groups["hf-perf-train-gpu-one-bert-large-bs4-fp16-samples-per-s"]
    # the same V100 log lines (Samples/second: 18.64) in perf_train_gpu_one.mdx and its zh copy
    assert [r["id"] for r in g[1:]] == ["hf-perf-train-gpu-one-bert-large-b4-fp16-1xv100"]
    assert "--optimizer-impl" in g[0]["gpuwise_args"]  # the 2022 run's version flags
    assert all(len(g) == 1 for k, g in groups.items() if k.startswith("torchtitan"))


def test_summary_counts_measurements_not_rows():
    rows = [{"id": "a", "source": "s", "repo": "o/r", "document": "d1", "gpu": "H100", "gpus": 8, "error_pct": 10.0},
            {"id": "b", "duplicate_of": "a"},
            {"id": "c", "source": "t", "repo": "o/q", "document": "d2", "gpu": "A100-80GB", "gpus": 64,
             "error_pct": -40.0}]
    s = ps.summary(rows)
    assert (s["measurements"], s["duplicate_rows"], s["sources"]) == (2, 1, ["o/q", "o/r"])
    assert (s["median_abs_error_pct"], s["max_abs_error_pct"], s["within_30_pct"]) == (25.0, 40.0, 1)


def test_stored_results_are_consistent():
    ids = {r["id"] for r in _speed_rows()}
    for r in RESULTS["rows"]:
        assert r["id"] in ids
        if r.get("duplicate_of"):
            continue
        assert r["error_pct"] == pytest.approx(100 * (r["predicted"] - r["measured"]) / r["measured"])
    assert RESULTS["summary"] == ps.summary(RESULTS["rows"])


@pytest.mark.slow
def test_one_row_recomputed_matches_the_stored_prediction():
    rid = "torchtitan-perf-llama213b-no-b2-64xa100"
    row = next(r for r in _speed_rows() if r["id"] == rid)
    stored = next(r for r in RESULTS["rows"] if r["id"] == rid)
    assert ps.predict_row(row)["predicted"] == pytest.approx(stored["predicted"], rel=0.01)


def test_torchtitan_h100_rows_run_on_the_gpu_the_page_states():
    # llama3_h100_202412_torchtitan.md: "96GB HBM2e with 2.4 TB/sec", "the default 500W power limit": not the
    # catalog's 80GB HBM3 700 W H100 SXM (priced as that, the rows came out +47 / +53 % too fast)
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks/published/torchtitan-throughput.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    titan = [r for r in rows if "202412" in r["id"] and r["gpuwise_args"]]
    assert titan
    for r in titan:
        args = r["gpuwise_args"]
        assert args[args.index("--gpu") + 1] == "H100-SXM-500W", r["id"]


def test_llm_foundry_rows_step_composer_decoupled_adamw_one_parameter_at_a_time():
    # Composer's DecoupledAdamW.adamw is a for-loop over the parameters (composer/optim/decoupled_weight_decay.py):
    # one parameter's sqrt / division temporaries at a time, not torch's foreach AdamW's whole-model ones (a 30b
    # shard's 15 GB on 8 GPUs, which had put four runs that ran over the card)
    path = ROOT / "benchmarks/published/llm-foundry-throughput.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = [r for r in rows if r["gpuwise_args"]]
    assert len(runs) == 209
    for r in runs:
        assert r["setting"]["optimizer"] == "decoupled_adamw"
        args = r["gpuwise_args"]
        assert args[args.index("--optimizer-impl") + 1] == "for-loop", r["id"]


def test_errors_grouped_by_how_full_the_card_is():
    """The memory-pressure table: each measurement in the group of its step's predicted share of the card,
    a step predicted not to fit in the last; duplicates and rows without a memory verdict left out."""
    gib = 2**30

    def row(used: float, err: float, **kw) -> dict:
        return {"id": f"r{used}-{err}", "device_used_bytes": used * gib, "gpu_memory_bytes": 80 * gib,
                "error_pct": err, **kw}

    rows = [row(40, 5.0), row(70, -3.0), row(77, 20.0), row(79, 30.0), row(90, 40.0),
            row(79, 99.0, duplicate_of="x"), {"id": "cpu", "error_pct": 1.0}]
    assert ps.by_memory_share(rows) == [("0.00 - 0.80", [5.0]), ("0.80 - 0.90", [-3.0]), ("0.95 - 0.98", [20.0]),
                                        (">= 0.98", [30.0, 40.0])]
