"""The diagnosis rules as pure functions over summary dicts shaped like a GPU run's (no GPU needed)."""

from __future__ import annotations

from gpuwise.monitoring import RULES, diagnose, suggest_num_workers
from gpuwise.plan.catalog import tensor_core_capability
from gpuwise.units import GIB


def gpu_summary(**over) -> dict:
    """A healthy A100 run: 100 ms steps, 2% data wait, 1% copy, GPU 95% busy, 30 of 40 GiB used, bf16."""
    s = {"steps": 100, "step_time_s": {"median": 0.100}, "data_wait_fraction": 0.02, "copy_fraction": 0.01,
         "compute_fraction": 0.97, "split": {"data_wait_s": {"median": 0.002}, "copy_s": {"median": 0.001}},
         "device": "cuda:0", "device_name": "NVIDIA A100-SXM4-40GB", "capability": [8, 0], "precision": "bf16",
         "batch_size": 64, "loader": {"num_workers": 4, "pin_memory": True, "persistent_workers": True},
         "pinned_fraction": 1.0, "batch_bytes": 64 * 3 * 224 * 224 * 4,
         "utilization": {"samples": 50, "mean_pct": 95.0, "low_fraction": 0.0, "high_fraction": 0.9},
         "memory": {"device_total_bytes": 40 * GIB, "use_fraction": 0.75, "planner_max_batch_size": None},
         "host": {"cpu_count": 16, "process_cpu_mean_pct": 100.0}, "ranks": []}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(s.get(key), dict):
            s[key] = {**s[key], **value}
        else:
            s[key] = value
    return s


def kinds(s: dict) -> list[str]:
    return [f.kind for f in diagnose(s)]


def test_registry_has_the_contract_kinds():
    assert {"data_starvation", "cpu_bound", "unpinned_copy", "low_memory_use", "precision",
            "rank_imbalance"} <= set(RULES)


def test_healthy_gpu_run_is_compute_bound_only():
    assert kinds(gpu_summary()) == ["compute_bound"]


def test_num_workers_arithmetic():
    # no workers: a batch takes 30 ms to load in the main process, the step without waiting 10 ms:
    # 30 / 10 * 1.25 = 3.75 -> 4 workers
    assert suggest_num_workers(step_s=0.040, data_s=0.030, num_workers=0, cpu_count=32) == 4
    # 2 workers and still waiting 20 of 30 ms: each worker needs 2 * 30 = 60 ms per batch,
    # the step without waiting is 10 ms: 60 / 10 * 1.25 = 7.5 -> 8, capped at cpu_count - 1 = 5
    assert suggest_num_workers(step_s=0.030, data_s=0.020, num_workers=2, cpu_count=None) == 8
    assert suggest_num_workers(step_s=0.030, data_s=0.020, num_workers=2, cpu_count=6) == 5


def test_data_starvation_from_wait_fraction_names_workers_and_pinning():
    s = gpu_summary(data_wait_fraction=0.75, compute_fraction=0.24, step_time_s={"median": 0.040},
                    split={"data_wait_s": {"median": 0.030}}, loader={"num_workers": 0, "pin_memory": False,
                                                                       "persistent_workers": False},
                    utilization={"mean_pct": 25.0, "low_fraction": 0.7, "high_fraction": 0.25})
    f = next(f for f in diagnose(s) if f.kind == "data_starvation")
    assert "75% of step time waits" in f.evidence and "oscillates" in f.evidence
    assert "num_workers=4" in f.fix and "pin_memory=True" in f.fix and "gpuwise tune" in f.fix
    assert "cpu_bound" not in kinds(s) and "compute_bound" not in kinds(s)


def test_data_starvation_from_oscillation_alone_in_an_external_watch():
    # `gpuwise watch` of a script without the monitor: no step split, only NVML samples.
    s = gpu_summary(data_wait_fraction=None, copy_fraction=None, compute_fraction=None, step_time_s={"median": None},
                    split={}, utilization={"mean_pct": 48.0, "low_fraction": 0.45, "high_fraction": 0.4})
    f = next(f for f in diagnose(s) if f.kind == "data_starvation")
    assert "45% of 50 samples" in f.evidence and "gpuwise.monitor" in f.fix


def test_cpu_bound_when_gpu_is_idle_without_data_wait():
    s = gpu_summary(utilization={"mean_pct": 30.0, "low_fraction": 0.1, "high_fraction": 0.0},
                    step_time_s={"median": 0.004})
    assert "cpu_bound" in kinds(s) and "compute_bound" not in kinds(s) and "data_starvation" not in kinds(s)
    f = next(f for f in diagnose(s) if f.kind == "cpu_bound")
    assert "30%" in f.evidence and "torch.compile" in f.fix


def test_unpinned_copy():
    # 6 ms for 38.5 MB = 6.4 GB/s (pageable); 12% of the step
    s = gpu_summary(copy_fraction=0.12, split={"copy_s": {"median": 0.006}}, pinned_fraction=0.0,
                    loader={"pin_memory": False})
    f = next(f for f in diagnose(s) if f.kind == "unpinned_copy")
    assert "12%" in f.evidence and "6.4 GB/s" in f.evidence and "pin_memory=True" in f.fix
    assert "unpinned_copy" not in kinds(gpu_summary(copy_fraction=0.12))  # already pinned
    assert "unpinned_copy" not in kinds(gpu_summary(copy_fraction=0.12, device="cpu", pinned_fraction=0.0))


def test_low_memory_use_with_and_without_the_planner():
    s = gpu_summary(memory={"use_fraction": 0.10})
    f = next(f for f in diagnose(s) if f.kind == "low_memory_use")
    # 4 GiB of 40 GiB; conservative linear guess 64 * 0.9 * 40 / 4 = 576
    assert "4 GiB of 40 GiB (10%)" in f.evidence
    assert "~576" in f.fix
    s = gpu_summary(memory={"use_fraction": 0.10, "planner_max_batch_size": 512})
    assert "largest batch on this GPU is 512" in next(f for f in diagnose(s) if f.kind == "low_memory_use").fix


def test_precision_on_tensor_core_gpus_only():
    assert "precision" in kinds(gpu_summary(precision="fp32"))
    assert "precision" not in kinds(gpu_summary(precision="tf32"))
    assert "precision" not in kinds(gpu_summary(precision="fp32", capability=[6, 0], device_name="Tesla P100"))
    v100 = next(f for f in diagnose(gpu_summary(precision="fp32", capability=[7, 0])) if f.kind == "precision")
    assert "float16" in v100.fix and "GradScaler" in v100.fix
    assert tensor_core_capability("NVIDIA H200") == (9, 0) and tensor_core_capability("NVIDIA A10G") == (8, 6)
    assert tensor_core_capability("NVIDIA L40S") == (8, 9) and tensor_core_capability("mystery") is None


def test_rank_imbalance():
    even = [{"rank": 0, "step_time_s_median": 0.100, "data_wait_fraction": 0.02},
            {"rank": 1, "step_time_s_median": 0.104, "data_wait_fraction": 0.03}]
    assert "rank_imbalance" not in kinds(gpu_summary(ranks=even))
    slow = even + [{"rank": 2, "step_time_s_median": 0.130, "data_wait_fraction": 0.25}]
    f = next(f for f in diagnose(gpu_summary(ranks=slow)) if f.kind == "rank_imbalance")
    assert "slowest/fastest = 1.30" in f.evidence and "rank 2" in f.fix  # 0.130 / 0.100


def test_low_memory_use_asks_the_planner_for_the_largest_batch():
    # a run of examples:mlp (batch 100) that used 1 GiB of a 40 GiB A100: the planner names the max batch
    from gpuwise.monitoring import StepRecord, Timeline, summarize
    from gpuwise.plan.hint import planner_max_batch

    tl = Timeline(steps=[StepRecord(i, 0.01 * i, 0.01, 0.0, 0.0, 0.01) for i in range(3)],
                  meta={"device": "cuda:0", "device_name": "NVIDIA A100-SXM4-40GB", "device_total_bytes": 40 * GIB,
                        "peak_reserved_bytes": GIB, "workload": "examples:mlp", "batch_size": 100,
                        "precision": "fp32"})
    s = summarize(tl, planner=planner_max_batch)  # the caller chooses to ask the planner
    planned = s["memory"]["planner_max_batch_size"]
    assert isinstance(planned, int) and planned > 100
    fix = next(f["fix"] for f in s["findings"] if f["kind"] == "low_memory_use")
    assert f"the planner's largest batch on this GPU is {planned} (now 100)" in fix


def test_the_rules_read_a_typed_summary_whose_dict_keeps_the_contract_keys_in_order():
    from gpuwise.monitoring import StepRecord, Summary, Timeline, summarize, summary_of

    tl = Timeline(steps=[StepRecord(i, 0.01 * i, 0.01, 0.004, 0.0, 0.006) for i in range(4)],
                  meta={"device": "cpu", "command": ["python", "train.py"]})
    typed = summary_of(tl)
    assert isinstance(typed, Summary) and typed.steps == 4 and typed.data_wait_fraction == 0.4  # 0.004 / 0.01
    d = summarize(tl)
    assert list(d)[:6] == ["steps", "step_time_s", "data_wait_fraction", "copy_fraction", "compute_fraction",
                           "findings"]
    assert list(d)[-2:] == ["command", "cannot_tell"] and d == typed.to_dict() and Summary.from_dict(d).to_dict() == d
    assert kinds(gpu_summary()) == [f.kind for f in diagnose(Summary.from_dict(gpu_summary()))]


def test_data_starvation_measures_the_loader_while_the_step_waits():
    # 30 of 40 ms waiting with no workers, 2 CPUs: keeping up needs 30 / 10 * 1.25 -> 4 workers.
    def fix(busy, framework=None):
        loader = {"num_workers": 0, "pin_memory": True, "persistent_workers": False}
        if busy is not None:
            loader["cpu_busy_fraction"] = busy
        s = gpu_summary(data_wait_fraction=0.75, compute_fraction=0.25, step_time_s={"median": 0.040},
                        split={"data_wait_s": {"median": 0.030}}, loader=loader, host={"cpu_count": 2},
                        framework=framework)
        return next(f for f in diagnose(s) if f.kind == "data_starvation").fix

    cpu = fix(0.97)  # decoding kept the main process runnable: capped at cpu_count - 1 = 1
    assert "DataLoader(num_workers=1)" in cpu and "CPU-bound" in cpu and "keeping up needs ~4" in cpu
    io = fix(0.05)  # it slept (storage, network): workers beyond the cores help
    assert "DataLoader(num_workers=4)" in io and "waits on I/O" in io and "keeping up" not in io
    unknown = fix(None)  # not measured: never lift the cap on a guess
    assert "num_workers=1" in unknown and "cannot tell whether loading is CPU- or I/O-bound" in unknown
    assert "TrainingArguments(dataloader_num_workers=1)" in fix(0.9, "transformers")
