"""`gpuwise.tune`: find, by measurement, the batch size, DataLoader settings and precision that train fastest.

The order follows what each setting depends on:

1. baseline: the workload as given (DataLoader defaults: num_workers=0, pin_memory=False), end to end;
2. precision: compute-only trials at the starting batch for each precision the device supports;
3. batch size: compute-only trials (`search.search_batch`): the throughput-optimal batch, and on a
   GPU the largest safe batch (seeded by the planner when it can predict one); the compute-only rate
   at the chosen batch is `limit_samples_per_s`;
4. DataLoader: one loader-only trial (no model, no workers) gives one worker's rate; compute rate /
   that rate estimates the workers needed; a hill climb on end-to-end trials finds the best count (and
   notices when more workers get slower); then pin_memory (CUDA only), prefetch_factor (when the step
   still waits on data) and persistent_workers (when restarting workers is a visible share of an epoch).

Every trial runs in a spawned child, is appended to the results file as it finishes, and is reused
on a rerun with the same settings. The budget is checked before each trial and bounds its timeout.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..devices.torch_device import resolve_device
from ..errors import GpuwiseError
from ..measuring.child import run_isolated
from ..measuring.oom import fake_oom_threshold
from ..plan.hint import ask_max_batch
from ..workload import Workload, load_workload
from . import search
from .records import Settings, Trial, TuneOptions
from .rules import lr_note, precision_candidates
from .store import TrialStore, key_of
from .trials import cpu_has_native_bf16, step_threads, usable_cpus

DEFAULT_BATCH = 32
MIN_STEPS_PER_EPOCH = 8      # the batch search stays below dataset size / 8
BATCH_LIMIT = 65536          # never grow the batch beyond this without a dataset
TRIAL_TIMEOUT_S = 600.0      # one trial, whatever the budget
PRECISION_BATCH_SHARE = 0.45  # with a dataset: the share of the budget after the baseline for precision + batch;
                              # the rest is the loader's (a 90 s budget ended at x1.00 without it: issue 14)
SHORT_BUDGET_TRIALS = 6       # fewer trials than this left after the baseline: the loader phase only
# seconds a trial costs besides its timed part (spawn + import torch; + CUDA context on a GPU), a first guess
OVERHEAD_GUESS_S = {"cpu": 5.0, "cuda": 20.0}


@dataclass
class TuneResult:
    workload: str
    device: str
    best: Settings
    baseline: Settings
    limit_samples_per_s: float | None
    trials: list[Trial]
    throughput_batch_size: int | None = None
    largest_safe_batch_size: int | None = None
    largest_safe_searched: bool = False
    batch_stop_reason: str = ""
    loader_samples_per_s_per_worker: float | None = None
    workers_estimate: int | None = None
    precisions: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    lr_note: str = ""
    budget_s: float = 0.0
    elapsed_s: float = 0.0
    out_of_budget: bool = False
    resumed_trials: int = 0

    @property
    def speedup(self) -> float | None:
        b, t = self.baseline.samples_per_s, self.best.samples_per_s
        return t / b if b and t else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(best=self.best.to_dict(), baseline=self.baseline.to_dict(), trials=[t.to_dict() for t in self.trials])
        d["speedup"] = self.speedup
        return d


def tune(workload: str | Workload, budget_s: float = 300, device: str | None = None, results: str | None = None,
         batch_sizes: list[int] | None = None, *, batch_size: int | None = None, precision: str = "fp32",
         precisions: list[str] | None = None, optimizer: str | None = None, measure_s: float = 2.0,
         max_workers: int | None = None, max_trials: int | None = None, min_gain: float = search.MIN_GAIN,
         on_trial: Callable[[Trial, float], None] | None = None) -> TuneResult:
    """Tune `workload` on `device` within `budget_s` seconds; every trial goes to `results` (JSONL).

    `batch_sizes` replaces the batch search by these candidates; `batch_size` is the batch of the
    baseline and the search's start (default 32); `precision` the baseline's precision; `precisions`
    the candidates (default: what the device supports cheaply). `max_trials` bounds the trials by count as
    `budget_s` does by time (trials read back from `results` count, so a rerun stops where the first one
    did); the search ends at whichever comes first. `on_trial(record, elapsed_s)` is called
    after each trial (the CLI's progress bar).
    """
    wl = load_workload(workload)
    options = TuneOptions(budget_s=budget_s, results=results, batch_sizes=batch_sizes, batch_size=batch_size,
                          precision=precision, precisions=precisions, optimizer=optimizer, measure_s=measure_s,
                          max_workers=max_workers, max_trials=max_trials, min_gain=min_gain,
                          on_trial=on_trial)
    return _Tuner(wl, resolve_device(device), options).run()


class _Tuner:
    def __init__(self, wl: Workload, device: str, options: TuneOptions):
        o = options
        if o.budget_s <= 0:
            raise GpuwiseError(f"the budget must be positive, got {o.budget_s}s")
        if o.max_trials is not None and o.max_trials < 1:
            raise GpuwiseError(f"max_trials must be at least 1, got {o.max_trials}")
        if o.max_workers is not None and o.max_workers < 0:
            raise GpuwiseError(f"max_workers must be 0 or more, got {o.max_workers}")
        self.wl, self.budget_s, self.device = wl, float(o.budget_s), str(device)
        self.dtype = self.device.split(":")[0]
        self.store = TrialStore(o.results)
        self.batch_sizes, self.batch_size, self.precision = o.batch_sizes, o.batch_size, o.precision
        self.precisions, self.optimizer, self.measure_s = o.precisions, o.optimizer, float(o.measure_s)
        self.max_workers, self.min_gain, self.on_trial = o.max_workers, o.min_gain, o.on_trial
        self.max_trials = o.max_trials
        self.start = time.monotonic()
        self.trials: list[Trial] = []
        self.ran_s: list[float] = []
        self.out_of_budget = False
        self.notes: list[str] = []
        self.resumed = 0
        self.session: dict[str, Trial] = {}
        self.info: dict[str, Any] = {}
        self.phase_end: float | None = None

    # --- budget and trials -------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        left = self.budget_s - self.elapsed()
        if self.phase_end is not None:  # a phase that must leave time for the ones after it
            left = min(left, self.phase_end - time.monotonic())
        return left

    def expected_trial_s(self) -> float:
        if self.ran_s:
            return statistics.median(self.ran_s)
        return OVERHEAD_GUESS_S.get(self.dtype, 5.0) + self.measure_s

    def out_of_time(self) -> bool:
        """True once the time left cannot fit a typical trial (80% of the median so far, or a first guess),
        or once `max_trials` trials are done."""
        if self.max_trials is not None and len(self.trials) >= self.max_trials:
            self.out_of_budget = True
            return True
        need = 0.8 * self.expected_trial_s()
        if self.remaining() < need:
            if self.budget_s - self.elapsed() < need:
                self.out_of_budget = True  # the whole budget, not only this phase's share
            return True
        return self.out_of_budget

    def trial(self, kind: str, batch_size: int, precision: str | None = None, num_workers: int | None = None,
              pin_memory: bool | None = None, prefetch_factor: int | None = None,
              persistent_workers: bool | None = None) -> Trial | None:
        """Run (or reuse) one trial; None when the budget is spent."""
        if kind in ("compute", "fit"):
            num_workers = pin_memory = prefetch_factor = persistent_workers = None
        if kind == "loader":
            precision = None
        settings = {"workload": self.wl.spec, "device": self.device, "kind": kind, "batch_size": batch_size,
                    "precision": precision, "optimizer": self.optimizer if kind != "loader" else None,
                    "num_workers": num_workers, "pin_memory": pin_memory, "prefetch_factor": prefetch_factor,
                    "persistent_workers": persistent_workers,
                    "measure_s": 0.0 if kind == "fit" else self.measure_s}
        key = key_of(settings)
        if key in self.session:  # asked again in this run (e.g. the batch search's start): same answer
            return self.session[key]
        old = self.store.get(settings)
        if old is not None:
            record = Trial.from_record({**old, "resumed": True})
            self.resumed += 1
        else:
            if self.out_of_time():
                return None
            kwargs = {**settings, "measure_s": self.measure_s}  # a fit trial's key says 0; run_trial knows
            kwargs["num_threads"] = step_threads(self.dtype, num_workers, usable_cpus()) if kind == "train" else None
            res = run_isolated("gpuwise.tuning.trials:run_trial", kwargs,
                               timeout_s=max(1.0, min(self.remaining(), TRIAL_TIMEOUT_S)))
            self.ran_s.append(res.seconds)
            value = res.value or {}
            record = Trial(**settings, status=res.status, oom=res.status == "oom",
                           samples_per_s=value.get("samples_per_s"), seconds=round(res.seconds, 3),
                           steps=value.get("steps"), startup_s=value.get("startup_s"),
                           num_threads=value.get("num_threads"), peak_memory_bytes=value.get("peak_memory_bytes"),
                           memory_kind=value.get("memory_kind"), error=res.error or None)
            self.store.add(record.to_record())
        self.session[key] = record
        self.trials.append(record)
        if self.on_trial is not None:
            self.on_trial(record, self.elapsed())
        return record

    def rate(self, record: Trial | None) -> float | None:
        return None if record is None else record.rate

    # --- phases --------------------------------------------------------------------------------
    def run(self) -> TuneResult:
        wl = self.wl
        ds_len = len(wl.build_dataset()) if wl.has_dataset else None
        b0 = self.batch_size or (min(self.batch_sizes) if self.batch_sizes else DEFAULT_BATCH)
        if ds_len is not None:
            if ds_len < 1:
                raise GpuwiseError(f"{wl.spec}: dataset() is empty")
            b0 = min(b0, ds_len)
        # an epoch of at least MIN_STEPS_PER_EPOCH steps: a batch that is a big share of the dataset
        # leaves the workers' pipeline restarting every few steps (and trains with very few updates)
        limit = max(1, ds_len // MIN_STEPS_PER_EPOCH) if ds_len else BATCH_LIMIT
        baseline_settings = Settings(b0, num_workers=0, pin_memory=False, prefetch_factor=None,
                                     persistent_workers=False, precision=self.precision)
        if ds_len is None:
            self.notes.append(f"{wl.spec} defines no dataset(): only batch size and precision were tuned")
        # 1. baseline
        base = (self.trial("train", b0, self.precision, 0, False, None, False) if ds_len
                else self.trial("compute", b0, self.precision))
        if base is not None and base.status == "error":
            error = str(base.error or "unknown error").removeprefix("WorkloadError: ")
            raise GpuwiseError(f"the workload as given fails, nothing to tune: {error}")
        if ds_len:
            # The loader is usually the bottleneck: precision and batch size get at most PRECISION_BATCH_SHARE of
            # what is left, so that a short budget still tries worker counts end to end; a budget of fewer than
            # SHORT_BUDGET_TRIALS trials goes to the loader alone (batch and precision stay as given).
            left = max(self.remaining(), 0.0)
            short = left < SHORT_BUDGET_TRIALS * self.expected_trial_s()
            self.phase_end = time.monotonic() + (0.0 if short else PRECISION_BATCH_SHARE * left)
            if short:
                self.notes.append(f"a short budget ({self.budget_s:g}s, trials of ~{self.expected_trial_s():.0f}s): "
                                  "the DataLoader was tuned at the given batch size and precision")
        # 2. precision
        prec_rates, chosen_prec = self.tune_precision(b0)
        # 3. batch size
        bs = self.tune_batch(b0, chosen_prec, limit)
        self.phase_end = None
        best_b = bs.best_batch_size or b0
        limit_rec = self.trial("compute", best_b, chosen_prec)
        limit_rate = self.rate(limit_rec)
        # 4. DataLoader
        loader_rate, w_est, best = None, None, None
        if ds_len is not None:
            loader_rate, w_est, best = self.tune_loader(best_b, chosen_prec, limit_rate, ds_len)
            if best is not None:
                best = self.refine_batch(best, chosen_prec)
        if best is None and ds_len is not None:  # the budget ran out first: the fastest end-to-end trial
            ran = [t for t in self.trials if t.kind == "train" and t.ok]
            if ran:
                best = max(ran, key=lambda t: t.samples_per_s).settings()
        if best is None:  # no dataset (or no end-to-end trial at all): the compute answer
            best = replace(baseline_settings, batch_size=best_b, precision=chosen_prec,
                           samples_per_s=limit_rate if ds_len is None else None)
        base_d = replace(baseline_settings, samples_per_s=self.rate(base))
        if self.out_of_budget:
            spent = (f"the trial limit ({self.max_trials})" if self.max_trials is not None
                     and len(self.trials) >= self.max_trials else f"the budget ({self.budget_s:g}s)")
            self.notes.append(f"{spent} ran out: the answer is the best found so far")
        note = lr_note(b0, best.batch_size)
        return TuneResult(
            workload=wl.spec, device=self.device, best=best, baseline=base_d, limit_samples_per_s=limit_rate,
            trials=self.trials, throughput_batch_size=bs.best_batch_size,
            largest_safe_batch_size=bs.largest_safe_batch_size if bs.largest_safe_searched else None,
            largest_safe_searched=bs.largest_safe_searched, batch_stop_reason=bs.stop_reason,
            loader_samples_per_s_per_worker=loader_rate, workers_estimate=w_est, precisions=prec_rates,
            notes=self.notes, lr_note=note, budget_s=self.budget_s, elapsed_s=round(self.elapsed(), 3),
            out_of_budget=self.out_of_budget, resumed_trials=self.resumed)

    def refine_batch(self, best: Settings, precision: str) -> Settings:
        """End to end, a smaller batch can beat the compute-optimal one (the input pipeline, not the
        step, sets the pace); halve it with the chosen loader settings while that is faster."""
        while best.batch_size > 1:
            b = best.batch_size // 2
            rec = self.trial("train", b, precision, best.num_workers, best.pin_memory,
                             best.prefetch_factor, best.persistent_workers)
            if rec is None or (self.rate(rec) or 0) <= (best.samples_per_s or 0):
                break
            best = replace(best, batch_size=b, samples_per_s=self.rate(rec))
        return best

    def tune_precision(self, b0: int) -> tuple[dict[str, dict[str, Any]], str]:
        info = self.device_info()
        cands, skipped = precision_candidates(self.dtype, info)
        if self.precisions:
            skipped = {p: why for p, why in skipped.items() if p not in self.precisions}
            cands = list(self.precisions)
        table: dict[str, dict[str, Any]] = {p: {"skipped": why} for p, why in skipped.items()}
        for p in cands:
            rec = self.trial("compute", b0, p)
            table[p] = {"samples_per_s": self.rate(rec), "peak_memory_bytes": rec and rec.peak_memory_bytes,
                        "memory_kind": rec and rec.memory_kind, "status": rec.status if rec else "skipped"}
        measured = {p: v["samples_per_s"] for p, v in table.items() if v.get("samples_per_s")}
        if not measured:
            return table, self.precision
        chosen = max(measured, key=lambda p: measured[p])
        ref = measured.get(self.precision)
        if ref and measured[chosen] < ref * 1.03:  # within noise: keep what the user asked for
            chosen = self.precision
        return table, chosen

    def device_info(self) -> dict[str, Any]:
        self.info = self._device_info()
        return self.info

    def _device_info(self) -> dict[str, Any]:
        if self.dtype == "cuda":
            res = run_isolated("gpuwise.tuning.trials:device_info", {"device": self.device}, timeout_s=120)
            if not res.ok:
                raise GpuwiseError(f"cannot use {self.device}: {res.error}")
            return res.value
        return {"type": self.dtype, "cpu_bf16_native": cpu_has_native_bf16() if self.dtype == "cpu" else False}

    def tune_batch(self, b0: int, precision: str, limit: int) -> search.BatchSearch:
        def measure(b: int, timed: bool) -> search.Probe:
            rec = self.trial("compute" if timed else "fit", b, precision)
            if rec is None:
                return search.Probe(b, timed, "skipped")
            return search.Probe(b, timed, rec.status, rec.samples_per_s)

        if self.batch_sizes:
            probes = [measure(b, True) for b in sorted(set(self.batch_sizes)) if not self.out_of_time()]
            ok = [p for p in probes if p.status == "ok"]
            best = max(ok, key=lambda p: p.samples_per_s or 0).batch_size if ok else None
            return search.BatchSearch(best, max((p.batch_size for p in ok), default=None), probes,
                                      "the given batch sizes", any(p.status == "oom" for p in probes))
        oom_possible = self.dtype == "cuda" or fake_oom_threshold() is not None
        seed = self.planner_seed(b0, precision) if self.dtype == "cuda" else None
        return search.search_batch(measure, b0, oom_possible=oom_possible, seed=seed, limit=limit,
                                   min_gain=self.min_gain, out_of_time=self.out_of_time)

    def planner_seed(self, b0: int, precision: str) -> int | None:
        """The planner's predicted max batch for this GPU, when the planner is there and can say."""
        answer = ask_max_batch(self.wl, b0, self.info.get("name"), precision=precision, optimizer=self.optimizer)
        if answer.max_batch_size is None and answer.why_not != "no max batch":
            self.notes.append(f"no planner seed for the batch search ({answer.why_not}); searched from {b0}")
        return answer.max_batch_size

    def tune_loader(self, b: int, precision: str, limit_rate: float | None, ds_len: int):
        loader = self.trial("loader", b, None, 0, False, None, False)
        one_rate = self.rate(loader)
        cpus = usable_cpus()
        max_w = self.max_workers if self.max_workers is not None else min(2 * cpus, 32)
        est = search.workers_estimate(limit_rate or 0.0, one_rate or 0.0, min(cpus, max_w))
        pin = self.dtype == "cuda"
        rates: dict[int, float] = {}
        recs: dict[int, Trial] = {}
        while (w := search.next_workers(rates, est, max_w, tolerance=search.NOISE)) is not None:
            rec = self.trial("train", b, precision, w, pin, None, False)
            if rec is None:
                break
            recs[w] = rec
            rates[w] = self.rate(rec) if rec.ok else -1.0  # never the best
            if not rec.ok:
                self.notes.append(f"num_workers={w}: {rec.status}: {rec.error}")
        if not rates or max(rates.values()) < 0:
            return one_rate, est, None
        best_w = max(rates, key=lambda w: rates[w])
        slower = sorted(w for w in rates if w > best_w and 0 <= rates[w] < rates[best_w])
        if slower:
            self.notes.append(f"more workers got slower: {best_w} -> {slower[0]} workers "
                              f"{rates[best_w]:.0f} -> {rates[slower[0]]:.0f} samples/s")
        best = {"num_workers": best_w, "pin_memory": pin, "prefetch_factor": None, "persistent_workers": False}
        best_rec = recs[best_w]

        def variant(keep_unless_slower: bool, **change) -> Trial | None:
            """Try one change; keep it when faster, or (for a change whose only cost is memory and that a
            measured cost argues for) unless clearly slower."""
            s = {**best, **change}
            rec = self.trial("train", b, precision, s["num_workers"], s["pin_memory"], s["prefetch_factor"],
                             s["persistent_workers"])
            old = self.rate(best_rec) or 0
            bar = (1 - search.NOISE) * old if keep_unless_slower else old * (1 + 1e-9)
            if rec is not None and (self.rate(rec) or 0) >= bar:
                return rec
            return None

        if pin:  # pinned + non_blocking copies vs pageable: only a CUDA question
            won = variant(False, pin_memory=False)
            if won:
                best_rec, best = won, {**best, "pin_memory": False}
        if best_w > 0 and limit_rate and (self.rate(best_rec) or 0) < 0.9 * limit_rate:
            won = variant(True, prefetch_factor=4)  # still waiting on data: a deeper queue smooths the bursts
            if won:
                best_rec, best = won, {**best, "prefetch_factor": 4}
        if best_w > 0:
            rate = self.rate(best_rec) or 0
            epoch_s = ds_len / rate if rate else 0
            startup = best_rec.startup_s or 0
            if epoch_s and startup > 0.02 * epoch_s:  # restarting the workers every epoch is a visible cost
                won = variant(True, persistent_workers=True)
                if won:
                    best_rec, best = won, {**best, "persistent_workers": True}
        # CPU: the step's threads next to the workers
        threads = best_rec.num_threads if self.dtype == "cpu" and best_rec.num_threads else None
        return one_rate, est, Settings(b, **best, precision=precision, samples_per_s=self.rate(best_rec),
                                       num_threads=threads)
