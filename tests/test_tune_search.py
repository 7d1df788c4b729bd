"""The tuner's searches without a device: fake OOM thresholds, exact sequences, the trial store."""

import json
import os

import pytest
import torch

from gpuwise.jsonl import read_lines as read_records
from gpuwise.measuring.oom import FAKE_OOM_ENV, is_oom, maybe_fake_oom
from gpuwise.tuning import search
from gpuwise.tuning.records import Settings, TuneOptions
from gpuwise.tuning.rules import lr_note, precision_candidates
from gpuwise.tuning.store import TrialStore, key_of


def fake_measure(rate):
    """A trial that runs out of memory above GPUWISE_FAKE_OOM_ABOVE and is `rate(b)` samples/s otherwise."""
    def measure(b, timed):
        try:
            maybe_fake_oom(b)
        except Exception as exc:
            assert is_oom(exc)
            return search.Probe(b, timed, "oom")
        return search.Probe(b, timed, "ok", rate(b))
    return measure


def test_batch_search_grows_until_oom_then_bisects(monkeypatch):
    monkeypatch.setenv(FAKE_OOM_ENV, "40")
    # rate 1000*b/(b+32): 8 -> 200, 16 -> 333 (+67%), 32 -> 500 (+50%): every doubling pays >= 5%
    res = search.search_batch(fake_measure(lambda b: 1000 * b / (b + 32)), 8, oom_possible=True)
    # growth 8, 16, 32, 64 (OOM); then next_candidate bisects (32, 64): 48 oom, 40 ok, 44, 42, 41 oom
    assert res.sequence == [8, 16, 32, 64, 48, 40, 44, 42, 41]
    assert [p.timed for p in res.probes] == [True] * 4 + [False] * 5  # bisection uses short fit trials
    assert res.best_batch_size == 32
    assert res.largest_safe_batch_size == 40 and res.largest_safe_searched
    assert res.stop_reason == "out of memory at batch 64"


def test_batch_search_stops_when_doubling_gains_less_than_5_percent():
    # rate 1000*b/(b+8): 64 -> 889, 128 -> 941 (+5.9%), 256 -> 970 (+3.1% < 5%: stop, keep 128)
    res = search.search_batch(fake_measure(lambda b: 1000 * b / (b + 8)), 8, oom_possible=False)
    assert res.sequence == [8, 16, 32, 64, 128, 256]
    assert res.best_batch_size == 128
    assert not res.largest_safe_searched and "gained +3%" in res.stop_reason


def test_batch_search_seeded_by_planner_confirms_largest_then_grows_to_it(monkeypatch):
    monkeypatch.setenv(FAKE_OOM_ENV, "45")
    res = search.search_batch(fake_measure(lambda b: 1000 * b / (b + 32)), 8, oom_possible=True, seed=40)
    # seed mode, step 40//16 = 2: 40, 42, 44 ok, 48 oom, bisect 46 oom, 45 ok (resolution 1) -> largest 45
    # then speed: 8, 16, 32, then 64 > 45 so the largest safe 45 itself (584/s, +17%)
    assert res.sequence == [40, 42, 44, 48, 46, 45, 8, 16, 32, 45]
    assert [p.timed for p in res.probes] == [False] * 6 + [True] * 4
    assert res.largest_safe_batch_size == 45 and res.best_batch_size == 45


def test_batch_search_start_too_big_halves(monkeypatch):
    monkeypatch.setenv(FAKE_OOM_ENV, "5")
    res = search.search_batch(fake_measure(lambda b: float(b)), 16, oom_possible=True)
    # 16 oom; next_candidate halves: 8 oom, 4 ok; bisect (4, 8): 6 oom, 5 ok; then time the largest safe
    assert res.sequence == [16, 8, 4, 6, 5, 5]
    assert res.best_batch_size == 5 and res.largest_safe_batch_size == 5


def test_batch_search_respects_the_limit_and_the_budget():
    res = search.search_batch(fake_measure(float), 8, oom_possible=False, limit=20)
    assert res.sequence == [8, 16, 20] and res.best_batch_size == 20  # 20 = the dataset's size, say
    res = search.search_batch(fake_measure(float), 8, oom_possible=False, out_of_time=lambda: True)
    assert res.sequence == [] and res.stop_reason == "budget"


def test_fake_oom_is_a_real_torch_oom(monkeypatch):
    monkeypatch.setenv(FAKE_OOM_ENV, "10")
    maybe_fake_oom(10)
    with pytest.raises(torch.OutOfMemoryError):
        maybe_fake_oom(11)


def test_worker_hill_climb_stops_when_more_workers_get_slower():
    # estimate 2; 3 is faster, 4 slower, and 2 (3's other neighbour) is known: stop at 3
    rates = {}
    seq = []
    truth = {1: 80.0, 2: 100.0, 3: 120.0, 4: 110.0, 5: 90.0}
    while (w := search.next_workers(rates, 2, 8)) is not None:
        seq.append(w)
        rates[w] = truth[w]
    assert seq == [2, 3, 4]
    assert max(rates, key=rates.get) == 3
    # the estimate is the best: one step up, one step down, done
    rates, seq = {}, []
    while (w := search.next_workers(rates, 2, 8)) is not None:
        seq.append(w)
        rates[w] = {1: 90.0, 2: 100.0, 3: 95.0}[w]
    assert seq == [2, 3, 1]


def test_worker_hill_climb_crosses_a_plateau_within_the_noise_tolerance():
    # 2 -> 100, 3 -> 97 (within 5%: a plateau, not a slowdown), 4 -> 130, then 6 (steps of x1.5 from 4) -> 80
    truth = {1: 60.0, 2: 100.0, 3: 97.0, 4: 130.0, 6: 80.0}
    rates, seq = {}, []
    while (w := search.next_workers(rates, 2, 8, tolerance=0.05)) is not None:
        seq.append(w)
        rates[w] = truth[w]
    assert seq == [2, 3, 4, 6]
    rates, seq = {}, []  # without tolerance it stops at 3 (and checks 1)
    while (w := search.next_workers(rates, 2, 8)) is not None:
        seq.append(w)
        rates[w] = truth[w]
    assert seq == [2, 3, 1]


def test_workers_estimate_is_compute_rate_over_one_worker_rate_within_cpus():
    assert search.workers_estimate(2000, 850, 16) == 3   # ceil(2000 / 850) = ceil(2.35)
    assert search.workers_estimate(2000, 850, 2) == 2    # but only 2 CPUs
    assert search.workers_estimate(100, 850, 16) == 1    # one worker is already enough
    assert search.next_workers({}, 12, 8) == 8           # the estimate is clipped to max_workers


def test_store_appends_full_lines_and_skips_a_torn_one(tmp_path):
    path = str(tmp_path / "r.jsonl")
    store = TrialStore(path)
    a = {"workload": "w", "device": "cpu", "kind": "compute", "batch_size": 8, "precision": "fp32", "status": "ok",
         "samples_per_s": 10.0}
    b = {**a, "batch_size": 16, "status": "timeout"}
    store.add(a)
    store.add(b)
    with open(path, "a") as f:
        f.write('{"workload": "w", "kind": "comp')  # a kill in the middle of a write
    again = TrialStore(path)
    assert len(read_records(path)) == 2
    c = {**a, "batch_size": 32}
    again.add(c)  # the next trial after the torn line is kept, not glued onto it
    assert TrialStore(path).get(c)["batch_size"] == 32 and len(read_records(path)) == 3
    assert again.get(a)["samples_per_s"] == 10.0
    assert again.get(b) is None  # a timeout is run again on resume
    assert key_of(a) == key_of({**a, "samples_per_s": 99.0, "seconds": 3.0})  # results are not part of the key
    assert json.loads(open(path).readline())["batch_size"] == 8


def test_store_refuses_a_results_path_it_cannot_append_to(tmp_path):
    from gpuwise.errors import GpuwiseError

    with pytest.raises(GpuwiseError, match="is a folder"):
        TrialStore(str(tmp_path))
    (tmp_path / "plain").write_text("")
    with pytest.raises(GpuwiseError, match="cannot write"):
        TrialStore(str(tmp_path / "plain" / "r.jsonl"))  # a file where the folder should be


def test_precision_candidates_by_device():
    cands, skipped = precision_candidates("cpu", {"cpu_bf16_native": False})
    assert cands == ["fp32"] and set(skipped) == {"tf32", "fp16", "bf16"}
    cands, _ = precision_candidates("cpu", {"cpu_bf16_native": True})
    assert cands == ["fp32", "bf16"]
    cands, skipped = precision_candidates("cuda", {"tf32": True, "bf16": True, "fp16": True})
    assert cands == ["fp32", "tf32", "bf16", "fp16"] and not skipped
    cands, skipped = precision_candidates("cuda", {"tf32": False, "bf16": False, "fp16": True})  # a V100
    assert cands == ["fp32", "fp16"] and set(skipped) == {"tf32", "bf16"}


def test_lr_note():
    assert lr_note(32, 32) == ""
    note = lr_note(32, 128)
    assert "x4" in note and "x2" in note  # linear rule x4 (SGD), square-root rule x2 (Adam)


def test_no_env_leak():
    assert os.environ.get(FAKE_OOM_ENV) is None


def test_tune_orchestration_with_a_fake_device(monkeypatch, tmp_path):
    """The whole tune (phases, hill climb, prefetch/persistent decisions, best, notes) on a fake child runner.

    Fake device: compute 1000*b/(b+32) samples/s; one loader process 300 samples/s; end to end with w
    workers min(compute, 300*w), 20% slower past 3 workers (oversubscribed); persistent workers +10%.
    """
    from gpuwise.measuring.child import ChildResult
    from gpuwise.tuning import tuner

    calls = []

    def fake_run_isolated(target, kwargs, timeout_s=None, env=None):
        assert target == "gpuwise.tuning.trials:run_trial" and timeout_s > 0
        calls.append(kwargs)
        k, b, w = kwargs["kind"], kwargs["batch_size"], kwargs["num_workers"]
        compute = 1000 * b / (b + 32)
        if k in ("compute", "fit"):
            rate = compute
        elif k == "loader":
            rate = 300.0
        elif w == 0:
            rate = 1 / (1 / 300 + 1 / compute)
        else:
            rate = min(compute, 300.0 * w) * (0.8 if w > 3 else 1.0) * (1.1 if kwargs["persistent_workers"] else 1)
        return ChildResult("ok", {"samples_per_s": rate, "startup_s": 0.5, "peak_memory_bytes": 1 << 20,
                                  "memory_kind": "host_rss", "num_threads": 1}, seconds=1.0)

    monkeypatch.setattr(tuner, "run_isolated", fake_run_isolated)
    monkeypatch.setattr(tuner, "usable_cpus", lambda: 4)
    monkeypatch.setattr(tuner, "cpu_has_native_bf16", lambda: False)
    wl = tmp_path / "job.py"
    wl.write_text("import torch\n"
                  "def model(): return torch.nn.Linear(2, 2)\n"
                  "def batch(n): return torch.zeros(n, 2)\n"
                  "def dataset(): return torch.utils.data.TensorDataset(torch.zeros(2048, 2))\n")
    seen = []
    res = tuner.tune(str(wl), budget_s=600, device="cpu", results=str(tmp_path / "r.jsonl"),
                     on_trial=lambda rec, elapsed: seen.append(rec))
    got = [(c["kind"], c["batch_size"], c["num_workers"], c["prefetch_factor"], c["persistent_workers"]) for c in calls]
    assert got == [
        ("train", 32, 0, None, False),      # baseline: the workload as given
        ("compute", 32, None, None, None),  # precision: fp32 only (no native bf16 on this fake CPU)
        ("compute", 64, None, None, None),  # batch: 667 (+33%)
        ("compute", 128, None, None, None),  # 800 (+20%)
        ("compute", 256, None, None, None),  # 889 (+11%), = 2048 samples / 8 steps per epoch: stop
        ("loader", 256, 0, None, False),    # one process: 300/s -> ceil(889/300) = 3 workers
        ("train", 256, 3, None, False),     # 889 (the compute limit)
        ("train", 256, 4, None, False),     # 711: more workers got slower
        ("train", 256, 2, None, False),     # 600
        ("train", 256, 3, None, True),      # startup 0.5 s > 2% of a 2.3 s epoch: 978
        ("train", 128, 3, None, True),      # end to end, half the batch: min(800, 900) * 1.1 = 880, slower
    ]
    assert len(seen) == len(calls)
    assert res.best.to_dict() == {"batch_size": 256, "num_workers": 3, "pin_memory": False, "prefetch_factor": None,
                        "persistent_workers": True, "precision": "fp32", "samples_per_s": pytest.approx(977.9, 0.01),
                        "num_threads": 1}
    assert res.baseline.samples_per_s == pytest.approx(1 / (1 / 300 + 1 / 500))  # 187.5
    assert res.limit_samples_per_s == pytest.approx(888.9, 0.01)
    assert res.workers_estimate == 3 and res.throughput_batch_size == 256
    assert any("more workers got slower: 3 -> 4" in n for n in res.notes)
    assert "x8" in res.lr_note  # 32 -> 256
    # a rerun reads every trial back: no child is started
    calls.clear()
    again = tuner.tune(str(wl), budget_s=600, device="cpu", results=str(tmp_path / "r.jsonl"))
    assert calls == [] and again.best == res.best and again.resumed_trials == 11


def test_tune_stops_at_the_budget(monkeypatch, tmp_path):
    from gpuwise.measuring.child import ChildResult
    from gpuwise.tuning import tuner

    clock = [0.0]

    def slow_child(target, kwargs, timeout_s=None, env=None):
        clock[0] += 40.0  # every trial costs 40 s of a 100 s budget
        assert timeout_s <= 100
        return ChildResult("ok", {"samples_per_s": 100.0}, seconds=40.0)

    monkeypatch.setattr(tuner, "run_isolated", slow_child)
    monkeypatch.setattr(tuner.time, "monotonic", lambda: clock[0])
    res = tuner.tune("examples:mlp", budget_s=100, device="cpu")
    # 0 s: baseline; 40 s: compute 32 (precision); 80 s: 20 s left < 80% of a 40 s trial: stop
    assert [t.kind for t in res.trials] == ["train", "compute"]
    assert res.out_of_budget and any("budget" in n for n in res.notes)


def test_end_to_end_batch_refinement_halves_while_faster(monkeypatch, tmp_path):
    from gpuwise.measuring.child import ChildResult
    from gpuwise.tuning import tuner

    calls = []

    def fake(target, kwargs, timeout_s=None, env=None):
        calls.append((kwargs["kind"], kwargs["batch_size"]))
        # end to end, the pipeline prefers small batches: 64 -> 400, 32 -> 450, 16 -> 440
        rate = {64: 400.0, 32: 450.0, 16: 440.0}[kwargs["batch_size"]]
        return ChildResult("ok", {"samples_per_s": rate}, seconds=1.0)

    monkeypatch.setattr(tuner, "run_isolated", fake)
    t = tuner._Tuner(tuner.load_workload("examples:mlp"), "cpu",
                     TuneOptions(budget_s=600, precision="fp32", measure_s=1.0, min_gain=0.05))
    best = {"batch_size": 64, "num_workers": 2, "pin_memory": False, "prefetch_factor": None,
            "persistent_workers": True, "precision": "fp32", "samples_per_s": 400.0}
    out = t.refine_batch(Settings(**best), "fp32")
    assert calls == [("train", 32), ("train", 16)]  # 32 is faster: try 16, which is not: keep 32
    assert out.to_dict() == {**best, "batch_size": 32, "samples_per_s": 450.0}
