"""The truth-corpus script's plumbing, on the CPU with a tiny subset (the corpus itself needs a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwise.truth import TRUTH_FIELDS
from gpuwise.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "truth" / "collect.py"
sys.path.insert(0, str(SCRIPT.parent))
import collect  # noqa: E402


def test_the_corpus_plan_meets_the_issue():
    configs, maxes = collect.plan(quick=False), collect.max_batch_plan(quick=False)
    workloads = {c["workload"] for c in configs}
    assert len(workloads) >= 12
    assert len(configs) >= 216
    for w in workloads:
        grid = {(c["optimizer"], c["precision"]) for c in configs if c["workload"] == w and not c["checkpointing"]}
        assert grid == {(o, p) for o in ("sgd", "momentum", "adamw") for p in ("fp32", "bf16")}
        assert len({c["batch_size"] for c in configs if c["workload"] == w}) >= 3
    assert len(maxes) >= 5 and sum(c["checkpointing"] for c in configs) >= 3
    assert len({collect.key(c) for c in configs}) == len(configs)  # resumable: keys are unique


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks/truth/workloads").glob("[!_]*.py")), ids=lambda p: p.stem)
def test_corpus_workloads_load_and_make_batches(path):
    wl = load_workload(str(path))
    assert wl.build_batch(2) is not None


def run(*args, env=None):
    import os

    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def test_quick_cpu_run_writes_resumable_records(tmp_path):
    out = tmp_path / "cpu.jsonl"
    proc = run("--device", "cpu", "--quick", "--out", str(out), env={"GPUWISE_FAKE_OOM_ABOVE": "5"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    measured = [r for r in records if r["kind"] == "measure"]
    # examples:mlp x {sgd, adamw} x fp32 x {2, 4} = 4, plus examples:lenet with checkpointing = 5
    assert len(measured) == 5 and sum(r["checkpointing"] for r in measured) == 1
    for r in records:
        assert set(TRUTH_FIELDS) <= set(r) and r["torch"] and r["device"] == "cpu"
    assert all(r["peak_allocated_bytes"] > 0 and r["step_time_s"] > 0 for r in measured)
    (mb,) = [r for r in records if r["kind"] == "max_batch"]
    # in one process: 4 ok, 8 x, 6 x, 5 ok -> 5; confirmed by fresh processes: 5 ok, 6 out of memory
    assert mb["max_batch_in_process"] == 5 and mb["max_batch_size"] == mb["batch_size"] == 5
    assert [(t["batch_size"], t["status"]) for t in mb["max_batch_confirm_trials"]] == [(5, "ok"), (6, "oom")]
    (check,) = json.loads(out.with_suffix(".fresh-check.json").read_text())
    assert check["same_peaks"] and check["shared_peak_allocated_bytes"] == check["fresh_peak_allocated_bytes"]
    assert check["same_device_used"]
    assert "fresh check" in proc.stdout and "SAME peaks, same device used" in proc.stdout

    again = run("--device", "cpu", "--quick", "--out", str(out), "--fresh-checks", "0")
    assert again.returncode == 0, again.stderr
    assert "configs" not in again.stdout.split("records in")[0]  # nothing left to measure
    assert out.read_text().count("\n") == len(records)


def test_a_fresh_check_that_fails_is_a_different_row_not_a_crash():
    rec = {"kind": "measure", "workload": "examples:mlp", "batch_size": 2, "optimizer": "sgd", "precision": "fp32",
           "checkpointing": False, "oom": False, "peak_allocated_bytes": 1, "peak_reserved_bytes": None}
    (row,) = collect.fresh_check([rec], "cpu", 1, timeout_s=0.01)   # the child is killed at its timeout
    assert row["same_peaks"] is False and "timed out" in row["error"] and row["fresh_peak_allocated_bytes"] is None


def test_dry_run_lists_the_plan():
    proc = run("--dry-run")
    assert proc.returncode == 0
    # 19 workloads x 3 optimizers x 2 precisions x 3 batches = 342, plus 8 with checkpointing = 350
    assert proc.stdout.startswith("350 measurements of 19 workloads, 6 max-batch searches")


def test_gemm_bench_writes_rows_as_it_goes_and_compares_them_with_the_model(tmp_path):
    """benchmarks/truth/gemm_bench.py's plumbing on the CPU: the env line, a GEMM per dtype and attention rows
    written to --out, then --compare prices each GEMM with plan/speed/gemm.py for a catalog GPU."""
    bench = ROOT / "benchmarks" / "truth" / "gemm_bench.py"
    out = tmp_path / "ops.jsonl"
    run = subprocess.run([sys.executable, str(bench), "--device", "cpu", "--quick", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["op"] for r in rows] == ["env", "sdpa", "sdpa", "gemm", "gemm"]
    assert {r["dtype"] for r in rows if r["op"] == "gemm"} == {"bf16", "fp32"}
    assert all(r["measured_s"] > 0 for r in rows if r["op"] == "gemm")
    assert rows[1]["forward_flops"] == 4 * 1 * 2 * 16 * 16 * 8
    cmp = subprocess.run([sys.executable, str(bench), "--compare", str(out), "--gpu", "h100"],
                         capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stderr
    assert cmp.stdout.count("gemm linear_fwd") == 2 and "median |err|" in cmp.stdout


def test_a_record_counts_the_attention_kernels_that_ran():
    """collect.sdpa_kernels_counted: each SDPA call under the kernel torch's dispatcher picks for its inputs, asked
    once per distinct call; the call itself still runs (the same output)."""
    import torch
    import torch.nn.functional as F

    q = torch.randn(2, 4, 16, 8)
    bias = torch.zeros(16, 16, 4).permute(2, 0, 1)  # stride 4 in its last dimension
    original = F.scaled_dot_product_attention
    want = original(q, q, q)
    with collect.sdpa_kernels_counted() as kernels:
        for _ in range(3):
            got = F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q, attn_mask=bias)
    assert torch.equal(got, want)
    assert F.scaled_dot_product_attention is original and sum(kernels.values()) == 4
    # on a CPU both run torch's CPU flash kernel (a CPU does not ask the mask's stride); on a GPU the names differ
    assert set(kernels) <= {"flash_attention", "math"} and kernels.get("flash_attention", 0) >= 3, kernels


def test_attention_kernels_script_records_and_compares(tmp_path):
    """benchmarks/truth/attention_kernels.py's plumbing on the CPU: one line per workload and precision with the
    kernels counted, then --compare puts the estimate's kernels for a named GPU beside them."""
    script = ROOT / "benchmarks" / "truth" / "attention_kernels.py"
    out = tmp_path / "attention.jsonl"
    run = subprocess.run([sys.executable, str(script), "--device", "cpu", "--only", "gpt-mini", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["precision"] for r in rows] == ["fp32", "bf16"]
    assert all(sum(r["sdpa_kernels"].values()) == 6 for r in rows), rows  # gpt-mini's 6 blocks, one call each
    out.write_text("".join(json.dumps({**r, "gpu_name": "NVIDIA H200"}) + "\n" for r in rows))
    cmp = subprocess.run([sys.executable, str(script), "--compare", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert cmp.returncode == 0, cmp.stderr
    assert "estimated flash_attention" in cmp.stdout and "of 2 steps: the same kernels" in cmp.stdout
