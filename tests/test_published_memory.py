"""benchmarks/published_memory.py: the comparison of gpuwise's estimate with published GPU measurements.

Fast (seconds): units, the metric -> estimate-number mapping and the OOM verdict on made-up estimates, and
every stored result recompared from its stored prediction (the README table is what the results say).
Slow: one published row recomputed with gpuwise end to end, against its stored prediction."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "published"))

import corpus  # noqa: E402
import published_memory as pm  # noqa: E402

EST = {"peak_allocated_bytes": 21_000_000_000, "peak_reserved_bytes": 22_000_000_000,
       "device_used_bytes": 22_600_000_000}


def _row(metric, value, unit, gpu="A100-40GB"):
    return {"id": "x", "metric": metric, "value": value, "unit": unit, "setting": {"gpu": gpu}}


def test_metric_picks_the_estimate_number_and_unit():
    # 21e9 predicted vs 21.30 GB published: (21.0 - 21.3) / 21.3 = -1.41 %
    assert pm.compare(_row("max_allocated", 21.30, "GB"), EST)["err_pct"] == -1.41
    # 22e9 reserved vs 20 GiB = 21,474,836,480 B: +2.45 %
    assert pm.compare(_row("max_reserved", 20.0, "GiB"), EST)["err_pct"] == 2.45
    # nvidia-smi: device used 22.6e9 vs 21,000 MiB = 22,020,096,000 B: +2.63 %
    assert pm.compare(_row("nvidia_smi", 21000, "MiB"), EST)["err_pct"] == 2.63
    assert pm.compare(_row("active", 21.0, "GB"), EST)["err_pct"] == 0.0


def test_oom_verdict_is_device_used_against_the_gpu():
    # A100-40GB: 40 GiB = 42,949,672,960 B; 22.6e9 fits, 43e9 does not
    assert pm.compare(_row("oom", None, None), EST)["predicted_oom"] is False
    assert pm.compare(_row("oom", None, None), {**EST, "device_used_bytes": 43_000_000_000})["predicted_oom"] is True
    assert "predicted_oom" not in pm.compare(_row("oom", None, None, gpu="H100-96GB"), EST)  # not in the catalog


def test_summary_counts_false_alarms_among_runs_that_completed():
    # a run that completed on a catalog GPU but was predicted out of memory is the verdict's other error
    rows = [r for r in corpus.load_rows() if corpus.is_memory(r) and corpus.expressible(r)]
    ran = [r for r in rows if r["metric"] == "max_allocated"][:3]
    oom = next(r for r in rows if r["metric"] == "oom")
    results = {r["id"]: {"id": r["id"], "args": r["gpuwise_args"], "workload": r["setting"]["workload"],
                         "metric": r["metric"], "source": r["source"]["name"], "err_pct": 1.0, "predicted_bytes": 1e9,
                         "predicted_oom": i == 0} for i, r in enumerate(ran)}
    results[oom["id"]] = {"id": oom["id"], "args": oom["gpuwise_args"], "workload": oom["setting"]["workload"],
                          "metric": "oom", "source": oom["source"]["name"], "predicted_oom": True}
    s = pm.summary(corpus.load_rows(), results)
    assert s["ran"] == {"computed": 3, "predicted_oom": 1} and s["oom"]["predicted"] == 1
    assert "Runs that completed predicted OOM (a false alarm): 1 of 3" in pm.table(corpus.load_rows(), results)


def test_stored_results_recompare_to_what_is_stored():
    rows = {r["id"]: r for r in corpus.load_rows()}
    results = pm.load_results()
    checked = 0
    for rid, rec in results.items():
        if rid not in rows or "error" in rec or rec.get("args") != rows[rid]["gpuwise_args"]:
            continue
        again = pm.compare(rows[rid], rec)
        assert again.get("err_pct") == rec.get("err_pct"), rid
        assert again.get("predicted_oom") == rec.get("predicted_oom"), rid
        checked += 1
    assert checked >= 5


def test_table_lists_every_memory_row_once():
    # the README table is regenerated output (`--table`); what it must hold: every memory row, once
    rows = corpus.load_rows()
    text = pm.table(rows, pm.load_results())
    listed = [line.split(" | ")[0].lstrip("| ") for line in text.splitlines() if line.startswith("| ")]
    memory_ids = [r["id"] for r in rows if corpus.is_memory(r)]
    assert sorted(i for i in listed if i in set(memory_ids)) == sorted(memory_ids)


def test_resume_keeps_rows_with_the_same_arguments_and_workload(tmp_path, monkeypatch):
    monkeypatch.setattr(pm, "RESULTS", tmp_path / "r.json")
    monkeypatch.setattr(pm, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text(f"x\n{pm.BEGIN}\nstale-table\n{pm.END}\n")
    rows = [r for r in corpus.load_rows() if corpus.is_memory(r) and corpus.expressible(r)]
    done = {r["id"]: {"id": r["id"], "args": r["gpuwise_args"], "workload": r["setting"]["workload"],
                      "metric": r["metric"], "source": r["source"]["name"], "error": "stored"} for r in rows}
    (tmp_path / "r.json").write_text(json.dumps(done))
    ran = []
    monkeypatch.setattr(pm, "run_row", lambda row, timeout_s=None: ran.append(row["id"]) or done[row["id"]])
    pm.main([])
    assert ran == []                        # everything already computed with these arguments and workloads
    moved = rows[0]["id"]
    (tmp_path / "r.json").write_text(json.dumps({**done, moved: {**done[moved], "workload": "elsewhere.json"}}))
    pm.main([])
    assert ran == [moved]                   # a row whose workload changed is computed again
    (tmp_path / "r.json").write_text(json.dumps(done))
    ran.clear()
    pm.main(["--failed"])
    assert sorted(ran) == sorted(done)      # all stored as failed: recomputed
    assert "stale-table" not in (tmp_path / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("rid", ["litgpt-rt-lora-phi-1_5-bf16-mb4-1gpu",
                                 # QLoRA, bitsandbytes 0.42.0, accumulation, litgpt's loop keeping its loss
                                 "litgpt-hub-llama-3.2-1b-qlora-mb2-1xa10g"])
def test_one_row_recomputed_end_to_end(rid):
    results = pm.load_results()
    rows = {r["id"]: r for r in corpus.load_rows()}
    if rid not in results or "err_pct" not in results[rid]:
        pytest.skip("not computed yet")
    rec = pm.run_row(rows[rid])
    # the table is what the code gives now (the stored prediction and its error recomputed); whether a row
    # meets the target is the table's to say, not this test's (the Llama-3.2-1B QLoRA row is -8.8 %)
    assert rec["predicted_bytes"] == pytest.approx(results[rid]["predicted_bytes"], rel=0.005)
    assert rec["err_pct"] == pytest.approx(results[rid]["err_pct"], abs=0.5)
