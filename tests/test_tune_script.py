"""`gpuwise tune -- CMD` on an unmodified script: short trials with DataLoader overrides, samples/s from the
step hooks, trials ended cleanly, a resumable results file, one line and exit 2 when the script fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuwise.cli import main
from gpuwise.contracts import validate
from gpuwise.tuning.script import ScriptTrial, ScriptTuneResult, code_change, run_script_trial

PY = sys.executable
STARVED = str(Path(__file__).parent / "scripts" / "starved.py")


def test_tune_a_script_then_resume_from_its_results(capsys, tmp_path):
    results = tmp_path / "tune.jsonl"
    # a script that would run 400 steps: each trial is ended after its measured steps, not run to the end;
    # bounded by trial count (the script as it is, one worker count; a winner's re-measurement on top), not time
    cmd = ["--", PY, STARVED, "--steps", "400", "--batch-size", "8"]
    code = main(["tune", "--json", "--budget", "30m", "--max-trials", "2", "--measure", "1s", "--max-workers", "1",
                 "--results", str(results), *cmd])
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    assert d["baseline"]["num_workers"] == 0 and d["baseline"]["samples_per_s"] > 0 and d["batch_size"] == 8
    validate("tune", d)
    tried = [t["overrides"] for t in d["trials"]]
    assert tried[:2] == [{}, {"num_workers": 1}]  # the script as it is, then worker counts first
    for t in d["trials"]:
        assert t["status"] == "ok" and t["steps"] >= 5 and t["seconds"] < 60
    assert d["trials"][1]["loader"]["num_workers"] == 1  # the override reached the script's DataLoader
    assert d["code_change"].startswith(("DataLoader(..., num_workers=1)", "# keep your DataLoader settings"))
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(lines) == len(d["trials"])
    # a rerun with the same results file repeats no finished trial
    code = main(["tune", "--json", "--budget", "30m", "--max-trials", "2", "--measure", "1s", "--max-workers", "1",
                 "--results", str(results), *cmd])
    again = json.loads(capsys.readouterr().out)
    assert code == 0 and all(t["resumed"] for t in again["trials"][:2])
    assert again["baseline"]["samples_per_s"] == d["baseline"]["samples_per_s"]


def test_a_script_that_fails_is_one_line_and_exit_2(capsys, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nraise RuntimeError('model() failed: no such layer')\n")
    code = main(["tune", "--budget", "30s", "--", PY, str(script)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1] == ("gpuwise tune: error: cannot measure the command as it is: "
                       "RuntimeError: model() failed: no such layer")


def test_workload_or_command_not_both_and_no_injected_batch(capsys):
    assert main(["tune", "examples:mlp", "--", PY, STARVED]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["tune", "-b", "64", "--", PY, STARVED]) == 2
    assert "a script's batch size, precision and optimizer are its own" in capsys.readouterr().err
    assert main(["tune"]) == 2
    assert "gpuwise tune -- python train.py" in capsys.readouterr().err


def test_trial_on_a_script_without_steps_says_why():
    t = run_script_trial([PY, "-c", "import torch"], {}, measure_s=0.5, timeout_s=60)
    assert t.status == "too_few_steps" and "only 0 optimizer steps" in t.error


def test_code_change_in_the_scripts_own_terms():
    base = ScriptTrial({}, samples_per_s=10.0, loader={"num_workers": 0, "pin_memory": False,
                                                       "prefetch_factor": None, "persistent_workers": False})
    best = ScriptTrial({"num_workers": 2, "prefetch_factor": 4}, samples_per_s=25.0)
    result = ScriptTuneResult(["python", "t.py"], base, best, [base, best], 30.0)
    assert code_change(result) == "DataLoader(..., num_workers=2, prefetch_factor=4)"
    assert result.speedup == 2.5
    base.framework = "transformers"
    assert code_change(result) == "TrainingArguments(..., dataloader_num_workers=2, dataloader_prefetch_factor=4)"
    base.framework = "lightning"
    assert code_change(result).endswith("# in train_dataloader()")
    assert code_change(ScriptTuneResult(["x"], base, base, [base], 1.0)).startswith("# keep your")


def test_max_trials_bounds_a_workload_tune_by_count(tmp_path):
    from gpuwise.tuning import tune

    result = tune("examples:mlp", budget_s=1800, device="cpu", measure_s=0.2, max_trials=2,
                  results=str(tmp_path / "t.jsonl"))
    assert len(result.trials) == 2 and result.out_of_budget
    assert any(n.startswith("the trial limit (2) ran out") for n in result.notes)
