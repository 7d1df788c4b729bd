"""`gpuwise watch -- CMD`: exit codes pass through, crashes and Ctrl-C still leave a report, pids -> GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from gpuwise.cli import main
from gpuwise.contracts import validate

PY = sys.executable


def watch(capsys, *args: str) -> tuple[int, dict]:
    code = main(["watch", "--json", "--interval", "0.05", *args])
    out = capsys.readouterr().out
    summary = json.loads(out)  # exactly one JSON object on stdout
    validate("watch", summary)
    return code, summary


def test_exit_code_zero_and_three_pass_through(capsys):
    code, s = watch(capsys, "--", PY, "-c", "print('to stderr under --json')")
    assert code == 0 and s["exit_code"] == 0
    code, s = watch(capsys, "--", PY, "-c", "import sys, time; time.sleep(0.2); sys.exit(3)")
    assert code == 3 and s["exit_code"] == 3
    assert s["steps"] == 0 and s["data_wait_fraction"] is None  # no monitor in the command: no step split
    # the command never imports torch: the report says it cannot tell, and why, not "no problem found"
    assert s["findings"] == [] and len(s["cannot_tell"]) == 1
    assert "no Python process of the command imported torch" in s["cannot_tell"][0]
    assert s["utilization"]["samples"] == 0 and s["host"]["rss_peak_bytes"] > 0


def test_crashing_child_still_writes_the_report(capsys, tmp_path):
    report = tmp_path / "crash.html"
    code, s = watch(capsys, "--report", str(report), "--", PY, "-c",
                    "raise RuntimeError('boom')", "<script>alert(1)</script>")
    assert code == 1 and s["exit_code"] == 1
    page = report.read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_report_in_a_new_folder_is_written_and_a_bad_one_refused_before_the_run(capsys, tmp_path):
    report = tmp_path / "runs" / "today" / "r.html"
    code, s = watch(capsys, "--report", str(report), "--", PY, "-c", "print(1)")
    assert code == 0 and report.exists()
    marker = tmp_path / "ran"
    (tmp_path / "file").write_text("")
    code = main(["watch", "--report", str(tmp_path / "file" / "r.html"), "--", PY, "-c",
                 f"open({str(marker)!r}, 'w')"])
    assert code == 2 and "--report" in capsys.readouterr().err
    assert not marker.exists()  # the command did not run


def test_missing_command_is_a_one_line_error(capsys):
    assert main(["watch", "--", "/nonexistent/trainer"]) == 2
    assert "cannot start" in capsys.readouterr().err
    assert main(["watch"]) == 2


def test_per_step_split_from_a_child_using_the_monitor(capsys, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch, gpuwise\n"
        "torch.set_num_threads(1)\n"
        "with gpuwise.monitor(device='cpu') as mon:\n"
        "    for _ in range(6):\n"
        "        time.sleep(0.02)  # waiting for data (not wrapped)\n"
        "        with mon.phase('compute'):\n"
        "            time.sleep(0.002)\n"
        "        mon.step()\n")
    code, s = watch(capsys, "--", PY, str(script))
    assert code == 0 and s["steps"] == 6
    assert s["data_wait_fraction"] > 0.5
    assert "data_starvation" in [f["kind"] for f in s["findings"]]


def test_an_earlier_runs_rank_files_in_the_steps_dir_are_left_out(capsys, tmp_path):
    steps_dir = tmp_path / "steps"
    steps_dir.mkdir()
    # an earlier 2-rank run left rank 1's file (5 slow steps) in the folder; this run has rank 0 only
    stale = [{"type": "meta", "rank": 1, "pid": 1, "t0_unix": time.time() - 3600}]
    stale += [{"type": "step", "step": i, "start_s": i, "total_s": 1.0, "compute_s": 1.0, "rank": 1} for i in range(5)]
    (steps_dir / "monitor-rank1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stale))
    script = tmp_path / "train.py"
    script.write_text(
        "import time, gpuwise\n"
        "with gpuwise.monitor(device='cpu', sample=False) as mon:\n"
        "    for _ in range(3):\n"
        "        with mon.phase('compute'):\n"
        "            time.sleep(0.002)\n"
        "        mon.step()\n")
    code, s = watch(capsys, "--steps-dir", str(steps_dir), "--", PY, str(script))
    assert code == 0 and s["steps"] == 3 and s["ranks"] == []
    assert "rank_imbalance" not in [f["kind"] for f in s["findings"]]


def test_gpus_are_attributed_by_the_process_tree(capsys, tmp_path, monkeypatch):
    # The child writes a fake-GPU file naming its own pid on GPU 1 (97% busy): watch must match it.
    gpus = tmp_path / "gpus.json"
    entry = {"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_total_mib": 40960, "memory_used_mib": 10,
             "utilization_pct": 0, "processes": []}
    gpus.write_text(json.dumps([entry]))
    monkeypatch.setenv("GPUWISE_FAKE_GPUS", str(gpus))
    child = (
        "import json, os, time\n"
        f"entries = [{entry!r}, dict({entry!r}, index=1, utilization_pct=97, memory_used_mib=30000,\n"
        "               processes=[{'pid': os.getpid(), 'used_mib': 29990}])]\n"
        f"tmp = {str(gpus)!r} + '.tmp'\n"
        "json.dump(entries, open(tmp, 'w'))\n"
        f"os.replace(tmp, {str(gpus)!r})\n"
        "time.sleep(1.6)\n")
    code, s = watch(capsys, "--", PY, "-c", child)
    assert code == 0
    util = s["utilization"]
    assert util["samples"] >= 3 and util["mean_pct"] == 97.0  # only GPU 1, never the idle GPU 0
    assert s["memory"]["device_total_bytes"] == 40960 * 2**20


def test_ctrl_c_stops_the_child_and_still_writes_the_report(tmp_path):
    report = tmp_path / "stopped.html"
    started = tmp_path / "started"
    child = f"import time, pathlib; pathlib.Path({str(started)!r}).touch(); time.sleep(60)"
    proc = subprocess.Popen([PY, "-m", "gpuwise", "watch", "--json", "--report", str(report), "--", PY, "-c", child],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # wait for the event (the child runs), however slow the machine; the guard only ends a hung run
    deadline = time.monotonic() + 300
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the watched command never started"
    proc.send_signal(signal.SIGINT)  # to watch only: it forwards SIGINT to the child after a second
    out, _ = proc.communicate(timeout=300)  # a guard: watch ends as soon as the child has stopped
    s = json.loads(out)
    assert s["interrupted"] is True and s["exit_code"] != 0
    assert proc.returncode == s["exit_code"]
    assert report.exists() and os.path.getsize(report) > 1000


def test_process_tree_finds_grandchildren_like_psutil(tmp_path):
    import psutil

    from gpuwise.monitoring.sampler import process_tree

    ready = tmp_path / "ready"
    code = ("import subprocess, sys, time, pathlib; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)']); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(20)")
    child = subprocess.Popen([PY, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        tree = process_tree(child.pid)
        expected = [child.pid] + [c.pid for c in psutil.Process(child.pid).children(recursive=True)]
        assert sorted(tree) == sorted(expected) and len(tree) == 2  # the child and its grandchild
    finally:
        for c in psutil.Process(child.pid).children(recursive=True):
            c.kill()
        child.kill()
        child.wait()
    assert process_tree(child.pid) == []  # ended
