"""Variable-length batches over a run: which padded lengths a run's micro-steps reach, and the run's peak.

A fine-tuning run on a dataset of varying sample lengths pads each micro-batch to its longest sample, so a
step's memory follows that micro-batch's length. The longest sample is an upper bound for every step (what
gpuwise traces without a length distribution). Given the dataset's lengths and the run's number of
micro-steps, the run's peak is the larger of

  the first micro-step at the longest sample: litgpt's finetune scripts force the longest sample into
    iteration 0 (`get_batch(..., longest_seq_ix if iter_num == 0 else None)`, finetune/lora.py at 8641822,
    "so potential OOMs happen right away"), and transformers' `LengthGroupedSampler` puts the longest batch
    first for the same reason; it runs before any optimizer step and with no gradients accumulated before
    it (a loop that samples its first batch at random peaks no higher than this);
  the later micro-steps, with the optimizer state and the gradients accumulated so far, at the length
    they will reach: the expected maximum of the padded lengths of the (steps - 1) later micro-batches of
    this rank, i.e. of (steps - 1) x micro_batch independent draws from the distribution (each rank draws
    its own samples: litgpt seeds every rank differently, `seed_everything(1337 + global_rank)`, and its
    `get_batch` draws with `torch.randint`, with replacement).

A loop whose first batch is as random as the others (`longest_first=False`, `--first-batch random`: a plain
shuffled DataLoader) has no such first step: every micro-step is taken at the expected longest padded length
of all steps x micro_batch draws, with the gradients and optimizer state of a later step (whichever step draws
the longest: an upper bound for the one case where that is iteration 0).

Sampling by epochs (`per_epoch`, `--sampling epoch`: a shuffled DataLoader, or `DistributedSampler(shuffle=True)`
giving each of R ranks a random ceil(N / R) of the N samples each epoch): within an epoch a rank draws without
replacement, so P(max of its k draws there <= L) = C(c(L), k) / C(N, k) (c(L): samples of length <= L; each
epoch's share a uniformly random subset), and the epochs multiply. Over a whole epoch on one rank the longest
sample is certain to come; with replacement it is not.

Which length: `expected_max` is the exact expectation of the largest of n draws (the n-th order statistic
of the empirical distribution), sum over lengths L of L x (F(L)^n - F(L-)^n). A step's memory is about
linear in its length (SDPA/flash attention keeps no L x L matrix), so the peak at the expected length is the
expected peak; with eager attention's L^2 scores it is a slight under-estimate (Jensen). `max_quantile`
gives the spread (the length the largest draw stays under with probability q).

Length files (`--seq-len-dist FILE`, docs/contracts.md): text, one entry a line; `LENGTH` is one sample
of that many tokens, `LENGTH COUNT` is COUNT samples of it (a histogram); blank lines and `#` comments are
skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import GpuwiseError
from ..hf import hf_workload, is_config_source
from ..units import fmt_bytes
from ..workload import load_workload
from .memory.cuda import RETRIES_NOTE, cuda_memory, replay_within, retries_note
from .memory.events import MemEvent, built_on_the_host, live_peak
from .memory.overheads import add_workspaces


@dataclass(frozen=True)
class LengthDist:
    """A dataset's sample lengths (tokens) as a histogram: `lengths` ascending and distinct, `counts` > 0."""

    lengths: tuple[int, ...]
    counts: tuple[int, ...]
    source: str = ""

    @property
    def samples(self) -> int:
        return sum(self.counts)

    @property
    def longest(self) -> int:
        return self.lengths[-1]

    def cdf(self) -> list[float]:
        """F(L_k): the share of samples of length <= L_k, for each k."""
        total, run, out = self.samples, 0, []
        for c in self.counts:
            run += c
            out.append(run / total)
        return out


def from_lengths(lengths, source: str = "") -> LengthDist:
    """A LengthDist from sample lengths (an iterable of positive integers)."""
    hist: dict[int, int] = {}
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise GpuwiseError(f"sample lengths must be positive integers, got {n!r}")
        hist[n] = hist.get(n, 0) + 1
    if not hist:
        raise GpuwiseError(f"{source or 'sample lengths'}: no samples")
    keys = sorted(hist)
    return LengthDist(tuple(keys), tuple(hist[k] for k in keys), source)


def read_length_file(path: str | Path) -> LengthDist:
    """Parse a length file (module docstring): one-line GpuwiseError on anything else."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuwiseError(f"--seq-len-dist {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    hist: dict[int, int] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            nums = [int(x) for x in parts]
        except ValueError:
            nums = []
        if len(parts) not in (1, 2) or len(nums) != len(parts) or min(nums) < 1:
            raise GpuwiseError(f"--seq-len-dist {path}, line {no}: expected LENGTH or LENGTH COUNT (positive "
                               f"integers), got {raw.strip()[:60]!r}")
        hist[nums[0]] = hist.get(nums[0], 0) + (nums[1] if len(nums) == 2 else 1)
    if not hist:
        raise GpuwiseError(f"--seq-len-dist {path}: no sample lengths in it (LENGTH or LENGTH COUNT, one a line)")
    keys = sorted(hist)
    return LengthDist(tuple(keys), tuple(hist[k] for k in keys), str(path))


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _max_cdf(dist: LengthDist, draws: int, per_epoch: int | None = None) -> list[float]:
    """P(the largest of `draws` draws <= L_k), for each k: with replacement F(L_k)^draws; by epochs of
    `per_epoch` draws without replacement (the module docstring) the product over the epochs of
    C(c_k, k_e) / C(N, k_e). Computed in logs."""
    if per_epoch is None:
        return [math.exp(draws * math.log(f)) if f > 0 else 0.0 for f in dist.cdf()]
    total, out, run = dist.samples, [], 0
    epochs = [(per_epoch, draws // per_epoch)] + ([(draws % per_epoch, 1)] if draws % per_epoch else [])
    for c in dist.counts:
        run += c
        if any(run < k for k, times in epochs if times):
            out.append(0.0)
            continue
        out.append(math.exp(sum(times * (_log_choose(run, k) - _log_choose(total, k)) for k, times in epochs if times)))
    return out


def expected_max(dist: LengthDist, draws: int, per_epoch: int | None = None) -> float:
    """E[max of `draws` draws from `dist`]: sum of L_k (G_k - G_{k-1}), G the largest draw's distribution
    (`_max_cdf`: independent draws with replacement, or by epochs of `per_epoch` without)."""
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise GpuwiseError(f"draws must be a positive integer, got {draws!r}")
    if per_epoch is not None and not 1 <= per_epoch <= dist.samples:
        raise GpuwiseError(f"draws per epoch must be within 1..{dist.samples} (the samples), got {per_epoch!r}")
    prev, total = 0.0, 0.0
    for length, g in zip(dist.lengths, _max_cdf(dist, draws, per_epoch), strict=True):
        total += length * (g - prev)
        prev = g
    return total


def max_quantile(dist: LengthDist, draws: int, q: float, per_epoch: int | None = None) -> int:
    """The smallest length L with P(max of `draws` draws <= L) >= q."""
    if not 0 < q <= 1:
        raise GpuwiseError(f"quantile must be in (0, 1], got {q!r}")
    for length, g in zip(dist.lengths, _max_cdf(dist, draws, per_epoch), strict=True):
        if g >= q - 1e-12:
            return length
    return dist.longest


@dataclass(frozen=True)
class RunLengths:
    """The lengths a run's micro-steps are traced at (per rank)."""

    first: int | None          # the first micro-step: the longest sample (None: the first batch is random)
    later: int | None          # the later micro-steps: ceil(E[max of `draws` draws]); None when steps == 1
    draws: int                 # (steps - 1) x micro_batch
    steps: int
    later_expected: float | None = None
    later_q10: int | None = None
    later_q90: int | None = None
    per_epoch: int | None = None   # by epochs: a rank's draws an epoch (without replacement); None: with

    def to_dict(self) -> dict:
        return {"first_seq_len": self.first, "later_seq_len": self.later, "later_expected_seq_len":
                None if self.later_expected is None else round(self.later_expected, 2),
                "later_seq_len_q10": self.later_q10, "later_seq_len_q90": self.later_q90,
                "draws": self.draws, "steps": self.steps, "draws_per_epoch": self.per_epoch}


def run_lengths(dist: LengthDist, steps: int, micro_batch: int, longest_first: bool = True,
                ranks: int | None = None) -> RunLengths:
    """The first micro-step's length (the longest) and the later ones' (the expected largest padded length
    over the (steps - 1) later micro-batches of `micro_batch` samples each, rounded up to a whole token).
    `longest_first=False`: no forced first step; every step at the expected longest of steps x micro_batch.
    `ranks`: sampling by epochs over that many data-parallel ranks (each draws ceil(N / ranks) samples an
    epoch, without replacement); None: independent draws with replacement."""
    for name, v in (("--micro-steps", steps), ("micro batch", micro_batch), ("ranks", ranks or 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise GpuwiseError(f"{name} must be a positive integer, got {v!r}")
    per_epoch = None if ranks is None else -(-dist.samples // ranks)
    draws = steps * micro_batch if not longest_first else (steps - 1) * micro_batch
    if draws == 0:
        return RunLengths(dist.longest, None, 0, steps)
    e = expected_max(dist, draws, per_epoch)
    later = min(dist.longest, math.ceil(e - 1e-9))
    return RunLengths(dist.longest if longest_first else None, later, draws, steps, e,
                      max_quantile(dist, draws, 0.1, per_epoch), max_quantile(dist, draws, 0.9, per_epoch), per_epoch)


def _before_any_step(events: list, start: int) -> list:
    """`events` without the blocks the optimizer allocated before `start` (the first forward): the tracer sets
    up the optimizer's state before its first step (so that its first step is already a steady one), but a
    run's iteration 0 comes before any optimizer step (AdamW makes its state lazily, in its first step())."""
    early = {e.block for e in events[:start] if e.action == "alloc" and e.phase == "optimizer"}
    return [e for e in events if e.block not in early] if early else list(events)


def first_micro_step(trace):
    """The trace up to the end of its first micro-step's backward (the run's iteration 0: setup, then one
    forward and backward, before any optimizer step -- no optimizer state -- and with no gradients
    accumulated before it), with `steady_start` at that micro-step's first event, so that a replay's peaks
    are that micro-step's. None when the trace has no forward followed by a backward."""
    end = _first_end(trace.events)
    if end is None:
        return None
    start = next(i for i, e in enumerate(trace.events) if e.phase == "forward")
    events = _before_any_step(trace.events[:end], start)
    start = next(i for i, e in enumerate(events) if e.phase == "forward")
    return dataclasses.replace(trace, events=events, steady_start=start, op_costs=None)


def _first_end(events) -> int | None:
    """The index just past the first micro-step's backward run, or None."""
    start = next((i for i, e in enumerate(events) if e.phase == "forward"), None)
    back = None if start is None else next((i for i in range(start, len(events)) if events[i].phase == "backward"),
                                           None)
    if back is None:
        return None
    return next((i for i in range(back, len(events)) if events[i].phase != "backward"), len(events))


def _alive(events) -> list:
    """The alloc events of the blocks alive after `events`, in allocation order."""
    alive: dict[int, object] = {}
    for e in events:
        if e.action == "alloc":
            alive[e.block] = e
        else:
            alive.pop(e.block, None)
    return list(alive.values())


def spliced(first, later):
    """One rank's run as one trace: `first`'s setup and first micro-step (at the longest sample), then `later`'s
    events from the end of its own first micro-step on (its second micro-step, optimizer step, steady step),
    so that the caching allocator replays the later steps in the state the first one left (the segments it
    cached at the longest length are kept: nothing calls empty_cache). At the join, what is alive in both
    (parameters, gradients, held buffers: paired by category in allocation order, same size) carries on as
    `first`'s block; what differs (a kept loss of another length) is freed and allocated again.
    `steady_start` is `later`'s steady step. None when either trace has no first micro-step."""
    end_a, end_b = _first_end(first.events), _first_end(later.events)
    if end_a is None or end_b is None or later.steady_start < end_b:
        return None
    start = next(i for i, e in enumerate(first.events) if e.phase == "forward")
    head = _before_any_step(first.events[:end_a], start)  # iteration 0: no optimizer state yet
    live_a, live_b = _alive(head), _alive(later.events[:end_b])
    by_cat: dict[str, list] = {}
    for e in live_a:
        by_cat.setdefault(e.category, []).append(e)
    mapping: dict[int, int] = {}
    bridge: list = []
    used: set[int] = set()
    next_block = max((e.block for e in first.events), default=-1) + 1
    for e in live_b:
        candidates = by_cat.get(e.category, [])
        match = next((a for a in candidates if a.nbytes == e.nbytes and a.block not in used), None)
        if match is not None:
            used.add(match.block)
            mapping[e.block] = match.block
    for a in live_a:
        if a.block not in used:
            bridge.append(MemEvent("free", a.block, a.nbytes, a.category, a.phase, a.module, a.op, a.stream))
    for e in live_b:
        if e.block not in mapping:
            mapping[e.block] = next_block
            bridge.append(dataclasses.replace(e, block=next_block))
            next_block += 1
    rest = []
    for e in later.events[end_b:]:
        if e.block not in mapping:
            mapping[e.block] = next_block
            next_block += 1
        rest.append(dataclasses.replace(e, block=mapping[e.block]))
    head = head + bridge
    return dataclasses.replace(later, events=head + rest, steady_start=len(head) + later.steady_start - end_b)


def first_micro_step_memory(trace, arch: str, loading: str | None = None, limit_bytes: int | None = None,
                            nccl_bytes: int = 0):
    """(peak allocated, peak reserved, the most reserved, outside-allocator bytes, what is live at the peak:
    a memory/events.py Peak in allocator-rounded sizes, the cudaMalloc retries, the replay with room where the
    card's `limit_bytes` made the allocator retry (else None)) of the first micro-step on a CUDA device:
    `first_micro_step(trace)` with the library workspaces, replayed once through the caching-allocator model
    (memory/cuda.py without its repeated steady steps: iteration 0 happens once), under the limit as
    `cuda_memory` replays a step (`nccl_bytes` outside the allocator as there). None when the trace has no first
    micro-step."""

    first = first_micro_step(trace)
    if first is None:
        return None

    with_ws, overheads = add_workspaces(built_on_the_host(first), arch, loading=loading, nccl_bytes=nccl_bytes)
    r, free = replay_within(with_ws, overheads, limit_bytes, 1)
    return (r.peak_allocated_bytes, r.peak_reserved_bytes, r.max_reserved_bytes, overheads.outside_allocator_bytes,
            live_peak(with_ws, round_to=512), r.retries, free)


def _with_batch_seq_len(wl, seq_len: int):
    """`wl` with its batch(batch_size) building samples of `seq_len` tokens: the workload's batch function must
    take a `seq_len` keyword (docs/contracts.md, workload files)."""
    fn = wl.batch_fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    if "seq_len" not in params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise GpuwiseError(f"--seq-len-dist: {wl.spec}'s batch() takes no seq_len keyword, so gpuwise cannot build "
                           "its batches at other lengths (define batch(batch_size, seq_len=...))")
    return dataclasses.replace(wl, batch_fn=functools.partial(fn, seq_len=seq_len))


def at_run_lengths(dist, micro_steps: int | None, batch_size: int, source, workload, seq_len: int | None,
                   task: str | None, longest_first: bool = True, ranks: int | None = None,
                   target_len: int | None = None):
    """For `estimate(seq_len_dist=..., micro_steps=...)`: (RunLengths, the workload at the later micro-steps'
    length, the workload at the first's). `dist`: a LengthDist or a length file's path; `source`: what the
    caller passed as its workload (an `hf:` id or config.json is rebuilt at each length), `workload` what
    `resolve_inputs` made of it."""
    if dist is None or micro_steps is None:
        raise GpuwiseError("--seq-len-dist and --micro-steps go together: the dataset's lengths and the run's "
                           "micro-steps per rank")
    if seq_len is not None:
        raise GpuwiseError("--seq-len-dist gives the lengths: leave out --seq-len")
    if not isinstance(dist, LengthDist):
        dist = read_length_file(dist)
    lengths = run_lengths(dist, micro_steps, batch_size, longest_first, ranks)
    if isinstance(source, str) and is_config_source(source):
        def at(n: int):
            return hf_workload(source, n, task, target_len=target_len)
    else:
        wl = load_workload(workload)

        def at(n: int):
            return _with_batch_seq_len(wl, n)
    return lengths, at(lengths.later or lengths.first), None if lengths.first is None else at(lengths.first)


def apply_run_peak(est, lengths: RunLengths, first_trace, arch: str, loading: str | None,
                   limit_bytes: int | None = None) -> None:
    """Make `est` (the later micro-steps' steady step, or the first's trace when there are none) the run's peak:
    the larger of it and the first micro-step at the longest sample (`first_trace()`: one rank's trace at
    that length; not called when `est` was traced there), each replayed as it runs on a card offering
    `limit_bytes` (memory/cuda.py: by retrying where the allocator's cache would not leave room). Sets
    `est.lengths` and a note."""
    if lengths.first is None:  # a random first batch: every step at the later length
        est.lengths = {**lengths.to_dict(), "peak_from": "later_micro_steps", "first_peak_allocated_bytes": None,
                       "first_peak_reserved_bytes": None, "later_peak_allocated_bytes": est.peak_allocated_bytes,
                       "later_peak_reserved_bytes": est.peak_reserved_bytes}
        est.notes.append(f"run lengths: every micro-step at {lengths.later} tokens, the expected longest of the run's "
                         f"{lengths.draws} samples on this rank ({lengths.later_expected:.1f}; 10-90 %: "
                         f"{lengths.later_q10}-{lengths.later_q90}), with a later step's gradients and state")
        return
    trace = est.trace if lengths.later in (None, lengths.first) else first_trace()
    nccl = est.overheads.nccl_bytes if est.overheads is not None else 0  # a rank's NCCL buffers, as `est`'s
    if est.target == "cpu":
        first = first_micro_step(trace)
        if first is None:
            raise GpuwiseError("--seq-len-dist: the traced step has no forward and backward to take as the first")
        at_peak = live_peak(first)
        f_alloc = f_res = f_used = at_peak.allocated_bytes
    else:
        got = first_micro_step_memory(trace, arch, loading, limit_bytes, nccl)
        if got is None:
            raise GpuwiseError("--seq-len-dist: the traced step has no forward and backward to take as the first")
        f_alloc, f_res, most, outside, at_peak, retries, f_free = got
        f_used = most + outside
        if f_free is not None:
            need = fmt_bytes(f_free.max_reserved_bytes + outside)
            est.notes.append(f"{RETRIES_NOTE} the first micro-step would hold {need} of device memory; under the limit "
                             "the caching allocator runs it by freeing its cache and retrying a failed cudaMalloc "
                             f"({retries} times)")
    later = (est.peak_allocated_bytes, est.peak_reserved_bytes, est.device_used_bytes)
    joined = None
    if est.target != "cpu" and lengths.later not in (None, lengths.first):
        joined = spliced(trace, est.trace)
        if joined is not None:  # the later steps replayed in the allocator state the first one left
            run = cuda_memory(joined, arch, loading, limit_bytes, nccl_bytes=nccl)
            later = (run.result.peak_allocated_bytes, run.result.peak_reserved_bytes, run.device_used_bytes)
            if run.free is not None:
                est.notes.append("run lengths, the first micro-step and the later ones replayed together: "
                                 + retries_note(run))
    if lengths.later is None:  # one micro-step: the run is iteration 0
        est.peak_allocated_bytes, est.peak_reserved_bytes, est.device_used_bytes = f_alloc, f_res, f_used
        source = "first_micro_step"
    else:
        source = "first_micro_step" if f_alloc > later[0] else "later_micro_steps"
        est.peak_allocated_bytes = max(f_alloc, later[0])
        est.peak_reserved_bytes = max(f_res, later[1])
        est.device_used_bytes = max(f_used, later[2])
    if source == "first_micro_step":  # the breakdown at the run's peak: the first micro-step's
        est.breakdown_at(at_peak)
    est.lengths = {**lengths.to_dict(), "peak_from": source,
                   "first_peak_allocated_bytes": f_alloc, "first_peak_reserved_bytes": f_res,
                   "later_peak_allocated_bytes": None if lengths.later is None else later[0],
                   "later_peak_reserved_bytes": None if lengths.later is None else later[1]}
    if lengths.later is None:
        est.notes.append(f"run lengths: one micro-step, at the longest sample ({lengths.first} tokens), before any "
                         "optimizer step: its peak is the run's")
    else:
        est.notes.append(
            f"run lengths: the first micro-step at the longest sample ({lengths.first} tokens, no gradients "
            f"accumulated before it, no optimizer state) peaks at {f_alloc} bytes allocated; the later "
            f"{lengths.steps - 1} micro-steps at {lengths.later} tokens (the expected longest of their "
            f"{lengths.draws} samples on this rank, {lengths.later_expected:.1f}; 10-90 %: {lengths.later_q10}-"
            f"{lengths.later_q90}) at {later[0]}: the run's peak is the "
            f"{'first (the breakdown is its)' if source == 'first_micro_step' else 'later ones'}"
            + ("" if est.target == "cpu" else "; the later steps replayed in the allocator state the first one left "
               "(its cached segments kept)" if joined is not None else "; reserved: the larger of the two (the "
               "later steps not replayed after the first: the traces could not be joined)"))
