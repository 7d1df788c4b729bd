"""The estimate against GPU truth: every record in benchmarks/truth/*.jsonl (measured on a real GPU) is
recomputed on the CPU. Targets (issue 3): peak allocated median |error| <= 1.5%, max <= 4%; what
nvidia-smi shows (device used) median <= 3%, max <= 6%. Skips, saying why, when there are no records.
Run with -s to see the error table."""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from gpuwise.plan.against_truth import truth_errors
from gpuwise.truth import read_records

ROOT = Path(__file__).resolve().parent.parent
TRUTH = ROOT / "benchmarks" / "truth"
RECORDS = read_records(TRUTH, root=ROOT)
# Each record costs one fake trace (seconds for a GPT-2): CI recomputes a sample spread over every workload,
# GPUWISE_TRUTH_ALL=1 (and benchmarks/truth_errors.py) recompute every record.
SAMPLE = 0 if os.environ.get("GPUWISE_TRUTH_ALL") == "1" else int(os.environ.get("GPUWISE_TRUTH_SAMPLE", "12"))


def spread(records: list[dict], n: int) -> list[dict]:
    """Up to n records, round-robin over workloads (then optimizer, precision, batch within one)."""
    if n <= 0 or len(records) <= n:
        return records
    by_wl: dict[str, list[dict]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r["workload"], r.get("optimizer") or "", r.get("precision") or "",
                                            r["batch_size"])):
        by_wl[r["workload"]].append(r)
    queues = [v[::-1] for v in by_wl.values()]
    out = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop())
    return out


# a max-batch record where not even batch 1 ran has no batch size: nothing to recompute
CHOSEN = spread([r for r in RECORDS if r.get("batch_size")], SAMPLE)

# Records known to miss a target after the fixes in hand, by metric: record ("<file>:<line>") -> why. They stay
# in every median; each is asserted against the max target in its own strict xfail, so a fix shows up as
# XPASS (a failure): then delete its entry. benchmarks/results/truth_errors.json has every record's errors.
H100, H200 = "nvidia-h100-80gb-hbm3.jsonl", "nvidia-h200.jsonl"
RESERVED = ("peak reserved under-predicted (-8..-15 %) where peak allocated is within 1.5 %: the allocator replay "
            "misses what the GPU reserved beyond it; for the convolutions (ResNet-50 bf16 b=64/256, ConvNeXt-T "
            "bf16 b=8) suspected: cuDNN's per-call workspaces, not modelled (docs/cuda-target.md)")
# (the 1B decoder's sgd bf16 b=2, no convolution, was listed too: at -5.6 % device used it is within the 6 %)
CONV_WORKSPACE = ("small convnets (LeNet, the example ResNet, the VGG-style convnet; H200, session 12) under-predicted, "
                  "fp32 to -61 % allocated: cuDNN's per-call convolution workspaces, sized by the engine its "
                  "heuristics pick (FFT / Winograd for fp32 without TF32), go through the caching allocator and are "
                  "not modelled (docs/cuda-target.md 'Library workspaces')")
CUDNN_RNN = ("nn.LSTM / nn.GRU on CUDA run cuDNN's RNN (aten._cudnn_rnn, plan/tracing/cudnn_rnn.py): at batch 16 "
             "a per-call constant is missing (-4..-20 % allocated: cuDNN's workspace, cudnnGetRNNTempSpaceSizes, not "
             "modelled); on device used the one reserve block per call moves the allocator replay (-13..+27 %)")
H200_CONV_ALLOCATED = (133, 134, 135, 139, 140, 141, 145, 146, 147, 148, 149, 150, 154, 155, 156, 160, 161, 162, 185,
                       186, 187, 191, 192, 193, 197, 198, 199)
H200_RNN_ALLOCATED = (203, 209, 215, 221, 224, 227, 230, 233, 236)
H200_CONV_DEVICE = (135, 141, 147, 148, 149, 150, 152, 153, 154, 155, 156, 159, 160, 162, 165, 185, 186, 187, 189, 190,
                    191, 192, 193, 195, 196, 197, 198, 199, 201, 202)
H200_RNN_DEVICE = (203, 204, 208, 209, 212, 214, 215, 218, 221, 222, 223, 225, 226, 228, 229, 232, 235,
                   237, 238)
T5_MASK = ("T5 measured under transformers 5.17, whose SDPA path passes T5's relative position bias as a mask with "
           "stride 8 in its last dimension (a permuted (q, k, heads) embedding): the memory-efficient kernel refuses "
           "it and the math kernel keeps the scores. transformers 5.23 (pinned here) copies the mask contiguous "
           "first, so this program runs the efficient kernel: -12..-29 % allocated. With 5.17's mask the estimate "
           "is within 0.07 % allocated, 0.82 % device used on all 18 rows "
           "(test_t5_records_with_the_mask_they_ran_with)")
H200_T5 = tuple(range(314, 332))
# ViT-S/16 b64 adamw bf16 with checkpointing (H200, session 33): every ViT row, ViT-S/16 and ViT-B/16 alike, is
# short by the same bytes per image x width (fp32: 0.98 MiB an image at width 768, 0.50 at 384; 10-133 MiB, -0.8..-2.6 %
# allocated); at this small peak (0.93 GB) the 50 MiB short are -5.7 %. Suspected: the 16x16 stride-16 patch
# convolution's cuDNN workspace, growing with the batch, as CONV_WORKSPACE
VIT_CHECKPOINTED = ("ViT-S/16 under checkpointing (0.93 GB peak): every ViT row is short by bytes growing with batch x "
                    "width (-0.8..-2.6 % allocated), here -5.7 %; suspected: the patch convolution's cuDNN workspace "
                    "(CONV_WORKSPACE), not found")
KNOWN_OFF: dict[str, dict[str, str]] = {
    "peak_allocated_err_pct": {**{f"{H200}:{n}": CONV_WORKSPACE for n in H200_CONV_ALLOCATED},
                               **{f"{H200}:{n}": CUDNN_RNN for n in H200_RNN_ALLOCATED},
                               **{f"{H200}:{n}": T5_MASK for n in H200_T5}, f"{H200}:350": VIT_CHECKPOINTED},
    # the H200's records (same driver, torch and sm_90) measured the same bytes as the H100's on these rows
    "device_used_err_pct": {**{f"{gpu}:{n}": RESERVED for gpu in (H100, H200)
                               for n in (79, 85, 91, 98, 99, 104, 105, 110, 111)},
                            **{f"{H200}:{n}": CONV_WORKSPACE for n in H200_CONV_DEVICE},
                            **{f"{H200}:{n}": CUDNN_RNN for n in H200_RNN_DEVICE},
                            **{f"{H200}:{n}": T5_MASK for n in H200_T5}, f"{H200}:350": VIT_CHECKPOINTED},
}


def _errors() -> list[dict]:
    if not RECORDS:
        pytest.skip(f"no GPU truth records in {TRUTH} yet: they are measured on a real GPU "
                    "(docs/contracts.md 'GPU truth records'); nothing to judge the CUDA estimate against")
    if not hasattr(_errors, "rows"):
        chosen = CHOSEN
        print(f"\nrecomputing {len(chosen)} of {len(RECORDS)} truth records (GPUWISE_TRUTH_ALL=1 for all)")
        _errors.rows = [truth_errors(r) for r in chosen]
        for r in _errors.rows:
            print(f"{r['source']:28} {r['workload']:24} b={r['batch_size']:<5} alloc {r['peak_allocated_err_pct']}% "
                  f"reserved {r['peak_reserved_err_pct']}% device {r['device_used_err_pct']}% oom={r['oom']}")
    return _errors.rows


def _abs(rows, key):
    vals = [abs(r[key]) for r in rows if r[key] is not None and not r["oom"]]
    if not vals:
        pytest.skip(f"no record has {key.removesuffix('_err_pct')} measured")
    return vals


TARGETS = {"peak_allocated_err_pct": (1.5, 4.0), "device_used_err_pct": (3.0, 6.0)}  # median, max |error| %


def _check(key: str) -> None:
    """The median over every recomputed record, the max over those not known to miss it."""
    rows = _errors()
    median_target, max_target = TARGETS[key]
    assert statistics.median(_abs(rows, key)) <= median_target, [(r["source"], r[key]) for r in rows]
    rest = [r for r in rows if r["source"] not in KNOWN_OFF[key]]
    worst = max((abs(r[key]) for r in rest if r[key] is not None and not r["oom"]), default=0.0)
    assert worst <= max_target, [(r["source"], r[key]) for r in rest]


def test_peak_allocated_matches_the_gpu():
    _check("peak_allocated_err_pct")


def test_device_used_matches_nvidia_smi():
    _check("device_used_err_pct")


def _known_cases():
    chosen = {r["_source"] for r in CHOSEN if "_source" in r}
    return [pytest.param(key, source, marks=pytest.mark.xfail(strict=True, reason=why), id=f"{key}-{source}")
            for key, known in KNOWN_OFF.items() for source, why in known.items() if source in chosen]


@pytest.mark.parametrize("key,source", _known_cases())
def test_known_misses_are_still_missed(key, source):
    [row] = [r for r in _errors() if r["source"] == source]
    assert abs(row[key]) <= TARGETS[key][1], row


def test_out_of_memory_records_are_predicted_not_to_fit():
    rows = [r for r in _errors() if r["oom"]]
    if not rows:
        pytest.skip("no out-of-memory record")
    assert all(r["predicted_fits"] is False for r in rows), rows


def test_truth_records_follow_the_contract():
    if not RECORDS:
        pytest.skip(f"no GPU truth records in {TRUTH} yet")
    required = {"workload", "batch_size", "optimizer", "precision", "checkpointing", "gpu_name",
                "peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes", "oom"}
    for r in RECORDS:
        assert required <= set(r), (r.get("_source"), required - set(r))


def test_the_comparison_itself_on_a_record_made_from_the_estimate(tmp_path):
    """The machinery, without a GPU: a record equal to the estimate has 0% error; one 10% higher, -9.09%."""
    import json

    from gpuwise.plan import estimate

    est = estimate("examples:mlp", 4, optimizer="sgd", gpu="NVIDIA H200", search_max_batch=False)
    rec = {"workload": "examples:mlp", "batch_size": 4, "optimizer": "sgd", "precision": "fp32",
           "checkpointing": False, "gpu_name": "NVIDIA H200", "peak_allocated_bytes": est.peak_allocated_bytes,
           "peak_reserved_bytes": est.peak_reserved_bytes, "device_used_bytes": int(est.device_used_bytes * 1.1),
           "step_time_s": 0.001, "oom": False}
    (tmp_path / "nvidia-h200.jsonl").write_text(json.dumps(rec) + "\n")
    [loaded] = read_records(tmp_path)
    row = truth_errors(loaded)
    assert row["peak_allocated_err_pct"] == 0.0 and row["peak_reserved_err_pct"] == 0.0
    assert row["device_used_err_pct"] == pytest.approx(100 * (1 / 1.1 - 1), abs=0.01)   # -9.09%
    assert row["source"] == "nvidia-h200.jsonl:1"


def test_a_record_says_when_its_model_library_was_another_version():
    from importlib.metadata import version

    from gpuwise.truth import versions_differ

    here = version("transformers")
    assert versions_differ({"transformers": here}) == {} and versions_differ({}) == {}
    assert versions_differ({"transformers": "5.17.0", "torch": "2.11.0"}) == (
        {} if here == "5.17.0" else {"transformers": {"measured": "5.17.0", "traced": here}})
    [timm] = versions_differ({"timm": "0.0.0.dev0"}).values()  # installed or not, never this version
    assert timm["measured"] == "0.0.0.dev0"


def test_spread_takes_every_workload_first():
    recs = [{"workload": w, "batch_size": b} for w in ("a", "b", "c") for b in (1, 2, 3)]
    assert [(r["workload"], r["batch_size"]) for r in spread(recs, 4)] == [("a", 1), ("b", 1), ("c", 1), ("a", 2)]
    assert spread(recs, 0) == recs


def _transformers_517_position_bias_mask(position_bias, attention_mask, is_causal, query, key):
    """transformers 5.17's `create_position_bias_mask`: the same mask as 5.23's, left in the position bias's
    own layout (the 5.23 version ends in `.contiguous()`)."""
    import torch

    lowest = torch.finfo(key.dtype).min
    if attention_mask is None and is_causal:
        causal = torch.arange(query.shape[2])[:, None] >= torch.arange(key.shape[2])[None, :]
        return torch.where(causal.view(1, 1, query.shape[2], key.shape[2]), position_bias, lowest)
    if attention_mask is None:
        return position_bias
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, position_bias, lowest)
    return position_bias + attention_mask


@pytest.mark.parametrize("line", [316, 319])  # b128 sgd: fp32, bf16
def test_t5_records_with_the_mask_they_ran_with(line, monkeypatch):
    """The T5 rows (T5_MASK) recomputed with the program that ran: the mask not contiguous, so SDPA's math
    kernel, with its dropout as CUDA runs it (a bool mask) and its matmuls in float32 under bf16 autocast."""
    sdpa_attention = pytest.importorskip("transformers.integrations.sdpa_attention")
    if not hasattr(sdpa_attention, "create_position_bias_mask"):
        pytest.skip("this transformers builds T5's SDPA mask another way")
    [record] = [r for r in RECORDS if r.get("_source") == f"{H200}:{line}"]
    assert record["workload"].endswith("t5.py") and record["transformers"] == "5.17.0"
    monkeypatch.setattr(sdpa_attention, "create_position_bias_mask", _transformers_517_position_bias_mask)
    row = truth_errors(record)
    assert abs(row["peak_allocated_err_pct"]) <= 0.5 and abs(row["device_used_err_pct"]) <= 1.5, row
