"""`gpuwise tune -- CMD`: tune the DataLoader of the user's own script, unchanged, by short trials.

Each trial runs the command with gpuwise's bootstrap (`gpuwise.bootstrap`), which overrides the
DataLoader's num_workers / pin_memory / prefetch_factor / persistent_workers and writes one record per
optimizer step. The trial ends (SIGTERM to its process group, SIGKILL after `KILL_GRACE_S`) once
`min_steps` steps after the warm-up took `measure_s`; samples/s is the samples the loader delivered in
those steps over their wall time. The warm-up skips the steps that the workers' start-up prefetch
serves (1 + num_workers x prefetch_factor), which would flatter every trial with workers.

Order, within the budget: the script as it is (baseline), then worker counts (1, 2, 4, ... while a
doubling wins), then prefetch_factor and persistent_workers with the best count, then pin_memory where the
script uses a GPU. Every trial's samples/s carries a 95% band (`tuning/noise_band.py`); a setting wins only
when it beats the current best outside both bands and by >= 5%. The winner is then re-measured back to back
with the script as written (winner, script, script, winner): it must beat the script outside the bands in
both pairs, else the answer is the script as it is: "no change helps at this noise". Batch size and precision change what the script computes:
they are measured and advised on (the best trial's monitor findings), never injected.
Every finished trial is appended to `results` (JSON lines); a rerun reuses finished trials.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..bootstrap import environment
from ..bootstrap.noise import ENV_BUDGET as NOISE_BUDGET
from ..errors import GpuwiseError
from ..jsonl import append_line, read_lines
from ..monitoring.hookfiles import read_hook_files
from ..monitoring.summary import summarize
from .noise_band import GAIN, Band, band, beats

CONFIRM_PAIRS = 2    # back-to-back re-measurements of the winner against the script as written
KILL_GRACE_S = 3.0   # SIGTERM -> SIGKILL
POLL_S = 0.25


@dataclass
class ScriptTrial:
    overrides: dict[str, Any]              # what the trial changed (empty: the script as it is)
    status: str = "ok"                     # ok | error | too_few_steps
    samples_per_s: float | None = None
    samples_per_s_low: float | None = None   # 95% band of samples/s (noise_band.band: blocks of steady steps)
    samples_per_s_high: float | None = None
    steps: int = 0                         # measured (steady) steps
    step_time_s: float | None = None       # median
    data_wait_fraction: float | None = None
    batch_size: int | None = None          # samples per optimizer step (median)
    loader: dict[str, Any] = field(default_factory=dict)  # the settings the script's loader really used
    device: str | None = None
    framework: str | None = None
    seconds: float = 0.0                   # wall time of the whole trial (start-up included)
    error: str | None = None
    resumed: bool = False
    advice: list[dict] = field(default_factory=list)  # the monitor's findings on this trial (batch, precision, ...)
    repeat: int = 0                        # 0: the search's trial; 1, 2...: a back-to-back re-measurement
    noise_scale: dict | None = None        # the trial's gradient_noise_scale (monitoring/noise_scale.py)
    optimizer: str | None = None           # the optimizer class the hooks saw

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def band(self) -> Band | None:
        if self.samples_per_s is None or self.samples_per_s_low is None or self.samples_per_s_high is None:
            return None
        return Band(self.samples_per_s, self.samples_per_s_low, self.samples_per_s_high, 0)


@dataclass
class ScriptTuneResult:
    command: list[str]
    baseline: ScriptTrial
    best: ScriptTrial
    trials: list[ScriptTrial]
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    decision: dict[str, Any] = field(default_factory=dict)  # "changed", "reason", the re-measured pairs

    @property
    def speedup(self) -> float | None:
        b, o = self.best.samples_per_s, self.baseline.samples_per_s
        return b / o if b and o else None

    def to_dict(self) -> dict:
        settings = dict(self.baseline.loader, **self.best.overrides)
        return {"command": self.command, "best": {**settings, "samples_per_s": self.best.samples_per_s,
                                                  "overrides": self.best.overrides},
                "baseline": {**self.baseline.loader, "samples_per_s": self.baseline.samples_per_s},
                "speedup": self.speedup, "batch_size": self.baseline.batch_size, "device": self.baseline.device,
                "framework": self.baseline.framework, "advice": self.best.advice,
                "trials": [t.to_dict() for t in self.trials], "elapsed_s": self.elapsed_s, "notes": self.notes,
                "decision": self.decision}


def _measured(steps: list, warmup: int) -> tuple[list, float]:
    steady = steps[warmup:]
    return steady, sum(s.total_s for s in steady)


def run_script_trial(cmd: list[str], overrides: dict[str, Any], measure_s: float = 3.0, min_steps: int = 5,
                     timeout_s: float = 120.0, env: dict | None = None, noise: bool = False) -> ScriptTrial:
    """Run `cmd` with DataLoader `overrides` until `min_steps` steady steps took `measure_s` (or it ends).

    `noise`: also probe the gradient noise scale (bootstrap/noise.py); off by default, since a probed step
    costs extra time that would blur the samples/s being compared."""
    folder = tempfile.mkdtemp(prefix="gpuwise-tune-")
    trial = ScriptTrial(dict(overrides))
    t0 = time.monotonic()
    err_path = os.path.join(folder, "stderr.txt")
    try:
        child_env = environment(folder, env, overrides=overrides, flush_every_s=0)
        if not noise:
            child_env[NOISE_BUDGET] = "0"
        with open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.DEVNULL, stderr=err,
                                        start_new_session=True)  # its DataLoader workers die with it
            except OSError as exc:
                raise GpuwiseError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
            merged, warmup = None, 2
            try:
                while True:
                    ended = proc.poll() is not None
                    merged, _ = read_hook_files(folder)
                    if merged is not None:
                        meta = merged.meta
                        workers = int(meta.get("loader_num_workers") or 0)
                        prefetch = int(meta.get("loader_prefetch_factor") or 2)
                        warmup = 2 + (workers * prefetch if workers else 0)
                        steady, seconds = _measured(merged.steps, warmup)
                        if len(steady) >= min_steps and seconds >= measure_s:
                            break
                    if ended or time.monotonic() - t0 > timeout_s:
                        break
                    time.sleep(POLL_S)
            finally:
                _stop(proc)
        code = proc.returncode
        trial.seconds = time.monotonic() - t0
        if merged is not None and len(merged.steps) - warmup < 2 and len(merged.steps) >= 3:
            warmup = 1  # a short script: measure what there is, past its first step
        steady, seconds = _measured(merged.steps, warmup) if merged is not None else ([], 0.0)
        if merged is not None:
            _describe(trial, merged)
        if len(steady) < 2 or seconds <= 0:
            trial.status = "error" if code not in (None, 0, -signal.SIGTERM, -signal.SIGKILL) else "too_few_steps"
            trial.error = (_last_line(err_path) if trial.status == "error" else None) or (
                f"only {len(merged.steps) if merged else 0} optimizer steps in {trial.seconds:.0f}s "
                f"(exit code {code})")
            return trial
        trial.steps = len(steady)
        trial.samples_per_s = sum(s.samples or 0 for s in steady) / seconds
        spread = band([s.samples or 0 for s in steady], [s.total_s for s in steady])
        if spread is not None:
            trial.samples_per_s_low, trial.samples_per_s_high = spread.low, spread.high
        trial.step_time_s = statistics.median(s.total_s for s in steady)
        trial.data_wait_fraction = sum(s.data_s for s in steady) / seconds
        return trial
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _describe(trial: ScriptTrial, merged) -> None:
    meta = merged.meta
    trial.loader = {k: meta.get(f"loader_{k}") for k in ("num_workers", "pin_memory", "prefetch_factor",
                                                         "persistent_workers")}
    trial.device = meta.get("device")
    trial.framework = meta.get("framework")
    sizes = [s.samples for s in merged.steps if s.samples]
    trial.batch_size = int(statistics.median(sizes)) if sizes else None
    trial.optimizer = meta.get("optimizer")
    try:
        summary = summarize(merged)
        found = summary.get("findings") or []
        trial.noise_scale = summary.get("gradient_noise_scale")
    except Exception as exc:  # advice is extra: a summary that cannot be made must not lose the trial
        found = [{"kind": "note", "evidence": f"no advice: {type(exc).__name__}: {exc}", "fix": ""}]
    trial.advice = [f for f in found if f.get("kind") not in ("data_starvation", "compute_bound")]


def _stop(proc: subprocess.Popen) -> None:
    """End the trial's whole process group: SIGTERM, then SIGKILL after KILL_GRACE_S."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_line(path: str) -> str | None:
    try:
        with open(path, errors="replace") as fh:
            lines = [line.strip() for line in fh if line.strip()]
    except OSError:
        return None
    return lines[-1][:300] if lines else None


def _key(cmd: list[str], overrides: dict, measure_s: float, repeat: int = 0) -> str:
    import json

    extra = {"repeat": repeat} if repeat else {}
    return json.dumps({"command": cmd, "overrides": overrides, "measure_s": measure_s, **extra}, sort_keys=True)


def tune_script(cmd: list[str], budget_s: float = 90.0, results: str | None = None, measure_s: float = 3.0,
                max_workers: int | None = None, on_trial: Callable[[ScriptTrial, float], None] | None = None,
                env: dict | None = None, max_trials: int | None = None) -> ScriptTuneResult:
    """Search the DataLoader settings of `cmd` (see the module docstring); raises GpuwiseError when the
    script as it is cannot be measured. `max_trials` bounds the search by count as `budget_s` does by time
    (trials read back from `results` count; the winner's back-to-back re-measurement comes on top, as it
    may run past the budget)."""
    if not cmd:
        raise GpuwiseError("no command given: use `gpuwise tune -- python train.py ...`")
    if budget_s <= 0:
        raise GpuwiseError(f"--budget must be positive, got {budget_s}")
    if max_trials is not None and max_trials < 1:
        raise GpuwiseError(f"--max-trials must be at least 1, got {max_trials}")
    if max_workers is not None and max_workers < 1:
        raise GpuwiseError(f"--max-workers must be at least 1, got {max_workers}")
    start = time.monotonic()
    done: dict[str, dict] = {}
    if results:
        for r in read_lines(results):
            if r.get("status") == "ok" and r.get("key"):
                done[r["key"]] = r
    trials: list[ScriptTrial] = []
    notes: list[str] = []
    cpus = os.cpu_count() or 1
    max_w = max_workers or 2 * cpus

    def left() -> float:
        return budget_s - (time.monotonic() - start)

    def trial(overrides: dict, repeat: int = 0) -> ScriptTrial:
        key = _key(cmd, overrides, measure_s, repeat)
        if key in done:
            rec = {k: v for k, v in done[key].items() if k in ScriptTrial.__dataclass_fields__}
            t = ScriptTrial(**{**rec, "resumed": True})
        else:
            t = run_script_trial(cmd, overrides, measure_s=measure_s, timeout_s=max(left(), 20.0), env=env)
            t.repeat = repeat
            if results:
                append_line(results, {"key": key, "command": cmd, **t.to_dict()})
        trials.append(t)
        if on_trial:
            on_trial(t, time.monotonic() - start)
        return t

    base = trial({})
    if base.status != "ok":
        raise GpuwiseError(f"cannot measure the command as it is: {base.error}")
    best = base
    per_trial_s = max(base.seconds, 1.0)

    def room() -> bool:  # once a setting has won, its back-to-back re-measurement (2 x CONFIRM_PAIRS trials) too
        if max_trials is not None and len(trials) >= max_trials:
            return False
        return left() >= (0.8 + (2 * CONFIRM_PAIRS if best is not base else 0)) * per_trial_s

    def spent() -> str:
        return "trial limit" if max_trials is not None and len(trials) >= max_trials else "budget"

    def better(t: ScriptTrial) -> bool:
        return t.status == "ok" and beats(t.band, best.band)

    own = int(base.loader.get("num_workers") or 0)
    counts = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= max_w and w != own]
    misses = 0
    for w in counts:
        if not room():
            notes.append(f"{spent()} spent before trying num_workers={w}")
            break
        t = trial({"num_workers": w})
        if better(t):
            best, misses = t, 0
        else:
            misses += 1
            if misses >= 2:  # two counts in a row without a gain: the cores (or the disk) are saturated
                break
    workers = int(dict(best.loader, **best.overrides).get("num_workers") or 0)
    extra: list[dict] = []
    if workers:
        extra += [{"prefetch_factor": 4}, {"persistent_workers": True}]
    if str(base.device or "").startswith("cuda"):
        extra.append({"pin_memory": True})
    for change in extra:
        if not room():
            notes.append(f"{spent()} spent before trying {change}")
            break
        t = trial(dict(best.overrides, **change))
        if better(t):
            best = t
    if not str(base.device or "").startswith("cuda"):
        notes.append("pin_memory not tried: the script trains on the CPU (pinning only speeds up copies to a GPU)")
    if best is not base and left() < 2 * CONFIRM_PAIRS * per_trial_s:
        notes.append("the back-to-back re-measurement of the winner may run past the budget")
    best, decision = _confirm(best, base, trial)
    return ScriptTuneResult(list(cmd), base, best, trials, time.monotonic() - start, notes, decision)


def _confirm(best: ScriptTrial, base: ScriptTrial, trial: Callable[..., ScriptTrial]) -> tuple[ScriptTrial, dict]:
    """Re-measure the winner and the script as written back to back (winner, script, script, winner, ...): the
    winner stays only if it beats the script outside both bands in every pair."""
    if best is base:
        return base, {"changed": False, "reason": "no change helps at this noise: no setting beat the script as "
                      f"written outside the bands and by >= {GAIN - 1:.0%}", "pairs": []}
    pairs = []
    for i in range(1, CONFIRM_PAIRS + 1):
        runs = [trial(best.overrides, i), trial({}, i)] if i % 2 else [trial({}, i), trial(best.overrides, i)]
        winner, script = runs if i % 2 else runs[::-1]
        pairs.append({"setting": winner.samples_per_s, "setting_band": [winner.samples_per_s_low,
                      winner.samples_per_s_high], "script": script.samples_per_s,
                      "script_band": [script.samples_per_s_low, script.samples_per_s_high],
                      "wins": winner.status == "ok" and script.status == "ok" and beats(winner.band, script.band)})
    settings = ", ".join(f"{k}={v}" for k, v in best.overrides.items())
    ratios = [p["setting"] / p["script"] for p in pairs if p["setting"] and p["script"]]
    shown = ", ".join(f"x{r:.2f}" for r in ratios)
    if all(p["wins"] for p in pairs):
        return best, {"changed": True, "reason": f"{settings} beat the script as written outside the bands in all "
                      f"{len(pairs)} back-to-back re-measurements ({shown})", "pairs": pairs}
    return base, {"changed": False, "reason": f"no change helps at this noise: {settings} won the search "
                  f"(x{best.samples_per_s / base.samples_per_s:.2f}) but not every back-to-back re-measurement "
                  f"against the script as written ({shown})", "pairs": pairs}


def code_change(result: ScriptTuneResult) -> str:
    """The change to paste, in the script's own terms (plain DataLoader, HF TrainingArguments, Lightning)."""
    changes = {k: v for k, v in result.best.overrides.items() if result.baseline.loader.get(k) != v}
    if not changes:
        return ("# keep your DataLoader settings: no change helps at this noise (none beat the script as it is "
                "outside the measured bands, by >= 5%, in back-to-back re-measurements)")
    framework = result.baseline.framework
    if framework == "transformers":
        args = ", ".join(f"dataloader_{k}={v!r}" for k, v in changes.items())
        return f"TrainingArguments(..., {args})"
    args = ", ".join(f"{k}={v!r}" for k, v in changes.items())
    where = "  # in train_dataloader()" if framework == "lightning" else ""
    return f"DataLoader(..., {args}){where}"
