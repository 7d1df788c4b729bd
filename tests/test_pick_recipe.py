"""The shell recipes users copy: pick's value is taken only when pick succeeded (an empty
CUDA_VISIBLE_DEVICES hides every GPU), and `gpuwise run` on a machine without GPUs refuses unless asked
to fall back to the CPU. No error suggests an option the command does not have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuwise.cli import main

README = Path(__file__).parent.parent / "README.md"
PY = sys.executable


def readme_pick_line() -> str:
    return next(line.split("  #")[0].strip() for line in README.read_text().splitlines()
                if "$(gpuwise pick -n 2" in line)


def shell(recipe: str, fake: Path, before: str = "export CUDA_VISIBLE_DEVICES=7") -> subprocess.CompletedProcess:
    script = (f'gpuwise() {{ "{PY}" -m gpuwise "$@"; }}\n{before}\n{recipe}\n'
              'status=$?\necho "status=$status cvd=[$CUDA_VISIBLE_DEVICES]"')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GPUWISE_FAKE_GPUS": str(fake)})


def test_readme_pick_recipe_fails_loudly_and_keeps_the_old_value(tmp_path):
    none = tmp_path / "none.json"
    none.write_text("[]")
    recipe = readme_pick_line()
    assert recipe.startswith("gpus=$(gpuwise pick") and "&& export CUDA_VISIBLE_DEVICES=$gpus" in recipe
    out = shell(recipe, none)
    assert out.stdout.strip() == "status=2 cvd=[7]"  # pick failed (exit 2) and nothing was exported
    assert "no GPU found" in out.stderr and "--device cpu" not in out.stderr
    four = Path(__file__).parent / "data" / "four_gpus.json"
    out = shell(recipe.replace("--wait 10m", "--no-reserve"), four, before="unset CUDA_VISIBLE_DEVICES")
    assert out.stdout.strip().startswith("status=0 cvd=[") and "cvd=[7]" not in out.stdout


def test_gpuwise_run_without_gpus_refuses_unless_cpu_fallback(tmp_path, monkeypatch, capsys):
    none = tmp_path / "none.json"
    none.write_text("[]")
    monkeypatch.setenv("GPUWISE_FAKE_GPUS", str(none))
    cmd = [PY, "-c", "import os; print('CVD=[' + os.environ['CUDA_VISIBLE_DEVICES'] + ']')"]
    assert main(["run", "--", *cmd]) == 2
    err = capsys.readouterr().err
    assert "no GPU found" in err and "--cpu-fallback" in err and "--device cpu" not in err
    assert main(["run", "--cpu-fallback", "--json", "--", *cmd]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d["cpu_fallback"] is True and d["exit_code"] == 0
