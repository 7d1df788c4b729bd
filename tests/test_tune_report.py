"""The tune answer as text and charts, from a hand-made result (no trials run)."""

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.report import tune as report
from gpuwise.tuning import TuneResult
from gpuwise.tuning.records import Settings, Trial


def _result(**best):
    settings = {"batch_size": 128, "num_workers": 3, "pin_memory": True, "prefetch_factor": 4,
                "persistent_workers": True, "precision": "bf16", "samples_per_s": 900.0, **best}
    where = {"workload": "examples:imagefolder", "device": "cuda:0"}
    trials = [Trial(**where, kind="compute", batch_size=b, precision="bf16", status="ok", samples_per_s=r,
                    num_workers=None, seconds=3.0) for b, r in ((32, 500.0), (64, 800.0), (128, 950.0))]
    trials += [Trial(**where, kind="train", batch_size=128, precision="bf16", status="ok", samples_per_s=r,
                     num_workers=w, pin_memory=True, prefetch_factor=None, persistent_workers=False,
                     seconds=5.0) for w, r in ((2, 600.0), (3, 880.0), (4, 850.0))]
    return TuneResult(workload="examples:imagefolder", device="cuda:0", best=Settings(**settings),
                      baseline=Settings(**{**settings, "batch_size": 32, "num_workers": 0, "pin_memory": False,
                                           "prefetch_factor": None, "persistent_workers": False, "precision": "fp32",
                                           "samples_per_s": 300.0}),
                      limit_samples_per_s=950.0, trials=trials, lr_note="batch 32 -> 128 (x4): ...")


def test_snippet_has_the_loader_arguments_autocast_and_the_lr_note():
    text = report.snippet(_result())
    assert ("DataLoader(dataset, batch_size=128, shuffle=True, num_workers=3, pin_memory=True, "
            "persistent_workers=True, prefetch_factor=4)") in text
    assert "x.to(device, non_blocking=True)" in text
    assert "torch.autocast('cuda', dtype=torch.bfloat16)" in text
    assert "(x3.00 the defaults)" in text  # 900 / 300
    assert "# batch 32 -> 128 (x4)" in text
    fp16 = report.snippet(_result(precision="fp16", num_workers=0, pin_memory=False))
    assert "GradScaler('cuda')" in fp16 and "scaler.scale(loss).backward()" in fp16
    assert "persistent_workers" not in fp16.splitlines()[1]  # worker-only options only with workers


def test_charts_are_written(tmp_path):
    paths = report.plot(_result(), str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in paths] == ["samples_per_s_vs_batch_size.png", "samples_per_s_vs_num_workers.png"]
    for p in paths:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_result_json_has_the_contract_keys():
    d = _result().to_dict()
    assert {"best", "baseline", "limit_samples_per_s", "trials"} <= set(d)
    assert d["speedup"] == 3.0


def test_gpuwise_tune_is_the_function_before_and_after_the_package_import():
    import importlib

    import pytest

    import gpuwise
    from gpuwise.errors import GpuwiseError

    for _ in range(2):
        # importing the packages (as the first call does) must not rebind the public names to them
        importlib.import_module("gpuwise.tuning.tuner")
        importlib.import_module("gpuwise.measuring.api")
        importlib.import_module("gpuwise.monitoring.core")
        assert callable(gpuwise.tune) and callable(gpuwise.measure) and callable(gpuwise.monitor)
        assert not any(isinstance(f, type(gpuwise)) for f in (gpuwise.tune, gpuwise.measure, gpuwise.monitor))
        with pytest.raises(GpuwiseError, match="budget must be positive"):
            gpuwise.tune("examples:mlp", budget_s=0)
    with pytest.raises(GpuwiseError, match="max_workers must be 0 or more"):
        gpuwise.tune("examples:mlp", budget_s=10, max_workers=-1)  # before any trial is started


def test_compute_only_row_names_the_batch_the_limit_was_measured_at():
    from rich.console import Console

    # the end-to-end refinement halved the batch to 64; the compute-only limit was measured at 128
    res = _result(batch_size=64)
    res.throughput_batch_size = 128
    console = Console(record=True, width=200)
    console.print(report.summary_table(res))
    row = next(line for line in console.export_text().splitlines() if "compute only" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[:2] == ["compute only", "128"] and cells[-1] == "950"


def test_cli_refuses_a_plot_folder_it_cannot_create_before_tuning(tmp_path, capsys):
    from gpuwise.cli import main

    (tmp_path / "file").write_text("")
    code = main(["tune", "examples:mlp", "--budget", "10m", "--plot", str(tmp_path / "file"), "--json"])
    assert code == 2 and "--plot" in capsys.readouterr().err  # at once, not after a 10-minute tune


def test_typed_results_keep_the_json_keys_in_their_order():
    """`best`, `baseline` and each trial are dataclasses now; their JSON is the contract's, key for key."""
    d = _result().to_dict()
    settings = ["batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "precision",
                "samples_per_s"]
    assert list(d["best"]) == settings and list(d["baseline"]) == settings  # no num_threads unless set
    assert list(Settings(8, num_threads=2).to_dict())[-1] == "num_threads"
    assert list(d["trials"][0]) == [
        "workload", "device", "kind", "batch_size", "precision", "optimizer", "num_workers", "pin_memory",
        "prefetch_factor", "persistent_workers", "measure_s", "status", "oom", "samples_per_s", "seconds", "steps",
        "startup_s", "num_threads", "peak_memory_bytes", "memory_kind", "error", "resumed"]
    record = _result().trials[0].to_record()
    assert "resumed" not in record and Trial.from_record({**record, "old_field": 1}) == _result().trials[0]


def test_plot_is_a_file_as_in_estimate_and_fit_and_a_folder_still_works_with_a_note(tmp_path, capsys):
    from gpuwise.commands.tune import _plot_is_folder

    out = tmp_path / "tune.png"
    assert _plot_is_folder(str(out)) is False and capsys.readouterr().err == ""
    assert report.plot_file(_result(), str(out)) == [str(out)]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _plot_is_folder(str(tmp_path / "charts")) is True and (tmp_path / "charts").is_dir()
    assert "deprecated" in capsys.readouterr().err
    with pytest.raises(GpuwiseError, match="does not exist"):
        _plot_is_folder(str(tmp_path / "no" / "such" / "tune.png"))
