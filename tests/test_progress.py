"""Progress of long measurements (issue 14): step lines on stderr, never on --json stdout; CPU rank counts
that fit the cores for `gpuwise scale`."""

from __future__ import annotations

import json
import re

import pytest

from gpuwise import cli
from gpuwise.commands import scale as scale_command
from gpuwise.measuring.progress import StepProgress, file_reporter, read_file
from gpuwise.report.progress import ProgressPrinter, progress_line
from gpuwise.scaleout import scale as scaleout_scale
from gpuwise.scaleout.scale import fit_cpu_ranks

LINE = re.compile(r"^measure: step (\d+)/(\d+) \(warm-up (\d+)\), [\d.]+ m?s/step, ~[\d.]+ m?s left$")


def test_progress_line_and_time_left():
    p = StepProgress(done=3, total=8, warmup=2, step_s=4.1)
    assert p.left_s == pytest.approx(5 * 4.1)
    assert progress_line("measure", p) == "measure: step 3/8 (warm-up 2), 4.1 s/step, ~20.5 s left"
    assert progress_line("scale", StepProgress(1, 9, 1, 0.002, "2 ranks")) == \
        "scale: 2 ranks: step 1/9 (warm-up 1), 2 ms/step, ~16 ms left"


def test_printer_prints_at_most_once_per_interval(capsys):
    now = [0.0]
    printer = ProgressPrinter("measure", interval_s=1.0, clock=lambda: now[0])
    for i in range(1, 11):  # ten steps in 0.9 s, then one more after the interval
        now[0] = i * 0.09
        printer(StepProgress(i, 11, 1, 0.09))
    now[0] = 1.2
    printer(StepProgress(11, 11, 1, 0.09))
    err = capsys.readouterr().err.splitlines()
    assert printer.lines == 2 and err[0].startswith("measure: step 1/11") and err[1].startswith("measure: step 11/11")


def test_file_reporter_round_trip(tmp_path):
    path = str(tmp_path / "p.json")
    assert read_file(path) is None
    write = file_reporter(path, min_interval_s=60)
    write(StepProgress(1, 5, 1, 0.5, "2 ranks"))
    write(StepProgress(2, 5, 1, 0.5, "2 ranks"))   # throttled: not written
    assert read_file(path) == StepProgress(1, 5, 1, 0.5, "2 ranks")
    write(StepProgress(5, 5, 1, 0.5, "2 ranks"))   # the last step always is
    assert read_file(path).done == 5


def test_measure_json_stdout_is_one_object_and_progress_is_on_stderr(capfd):
    code = cli.main(["measure", "examples:mlp", "-b", "8", "--device", "cpu", "--steps", "3", "--warmup", "2",
                     "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    json.loads(out)  # exactly one JSON object, nothing else
    steps = [LINE.match(ln) for ln in err.splitlines() if ln.startswith("measure: step")]
    assert steps and all(steps), err
    done, total, warmup = map(int, steps[0].groups())
    assert (done, total, warmup) == (1, 5, 2)
    assert "measure: step" not in out


class _Stop(Exception):
    pass


def _scale_args(monkeypatch, cores: int, *argv: str) -> tuple[list[int], object]:
    """Run `gpuwise scale` up to measure_scaling (no torchrun): what it would measure, and the stderr."""
    seen = {}

    def fake_measure(cfg, nprocs, **kwargs):
        seen["nprocs"], seen["cfg"] = nprocs, cfg
        raise _Stop

    monkeypatch.setattr(scale_command, "usable_cores", lambda: cores)
    monkeypatch.setattr(scale_command, "measure_scaling", fake_measure)
    cli.main(["scale", "examples:mlp", *argv])  # the CLI turns _Stop into an internal error: fine here
    return seen["nprocs"], seen["cfg"]


def test_scale_on_cpu_drops_rank_counts_above_the_cores(monkeypatch, capfd):
    nprocs, cfg = _scale_args(monkeypatch, 2, "-n", "1,2,4,8", "--device", "cpu")
    err = capfd.readouterr().err
    assert nprocs == [1, 2]
    note = [ln for ln in err.splitlines() if "dropped" in ln]
    assert len(note) == 1 and "4,8" in note[0] and "2 core(s)" in note[0] and "contention" in note[0]
    # defaults gpuwise chose for CPU ranks are small, and said
    assert (cfg.batch_size, cfg.steps, cfg.warmup) == (4, 4, 1)
    assert "--batch-size 4 --steps 4 --warmup 1" in err


def test_scale_oversubscribe_keeps_them_and_given_sizes_stay(monkeypatch, capfd):
    nprocs, cfg = _scale_args(monkeypatch, 2, "-n", "1,2,4", "--device", "cpu", "--oversubscribe",
                              "-b", "16", "--steps", "7", "--warmup", "2")
    err = capfd.readouterr().err
    assert nprocs == [1, 2, 4] and "dropped" not in err
    assert (cfg.batch_size, cfg.steps, cfg.warmup) == (16, 7, 2) and "small defaults" not in err


def test_fit_cpu_ranks_and_core_seam():
    assert fit_cpu_ranks([1, 2, 4, 8], 4) == ([1, 2, 4], [8])
    assert fit_cpu_ranks([3], 2) == ([], [3])
    assert scaleout_scale.usable_cores() >= 1


def test_scale_reports_rank_progress_on_stderr(capfd, monkeypatch):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    code = cli.main(["scale", "examples:mlp", "-n", "1", "--device", "cpu", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    json.loads(out)
    assert re.search(r"^scale: 1 rank: step \d+/9 \(warm-up 1\)", err, re.M), err
