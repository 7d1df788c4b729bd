"""The max-batch search: the pure strategy, the driver, and real isolated trials with a fake OOM."""

from __future__ import annotations

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.measuring.maxbatch import (
    OK,
    OOM,
    TrialOutcome,
    find_max_batch,
    isolated_trial,
    next_candidate,
    search,
)


def fake_trial(threshold: int | None, log: list[int] | None = None):
    """In-process trial: ok up to `threshold`, OOM above it (None: everything fits)."""
    def trial(batch: int) -> TrialOutcome:
        if log is not None:
            log.append(batch)
        return TrialOutcome(OOM if threshold is not None and batch > threshold else OK, 0.01)
    return trial


def test_next_candidate_power_of_two_then_bisect():
    assert next_candidate(None, None, 1) == 1
    assert next_candidate(8, None, 1) == 16          # doubling
    assert next_candidate(16, 32, 1) == 24           # (16 + 32) // 2
    assert next_candidate(20, 21, 1) is None         # adjacent: done
    assert next_candidate(None, 16, 16) == 8         # halving while the start fails
    assert next_candidate(None, 1, 1) is None        # even batch 1 fails


def test_next_candidate_seed_mode_grows_and_shrinks_from_the_seed():
    assert next_candidate(100, None, 100, step=6) == 106           # seed + step
    assert next_candidate(112, None, 100, step=6) == 124           # 112 + max(6, 112 - 100)
    assert next_candidate(None, 100, 100, step=6) == 94            # seed - step
    assert next_candidate(None, 88, 100, step=6) == 76             # 88 - max(6, 100 - 88)
    assert next_candidate(None, 10, 100, step=50) == 1             # never below 1


def test_next_candidate_limit_and_resolution():
    assert next_candidate(8, None, 1, limit=10) == 10
    assert next_candidate(10, None, 1, limit=10) is None
    assert next_candidate(None, None, 64, limit=10) == 10
    assert next_candidate(64, 80, 1, resolution=16) is None
    with pytest.raises(ValueError):
        next_candidate(None, None, 0)


def test_search_exact_sequence_without_seed():
    log: list[int] = []
    res = search(fake_trial(20, log), 1)
    # 1,2,4,8,16 fit; 32 fails; bisect (16,32) -> 24 x, 20 ok, 22 x, 21 x
    assert log == [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    assert res.max_batch_size == 20
    assert res.batch_sizes_tried == log
    assert [t.status for t in res.trials][-3:] == [OK, OOM, OOM]
    assert not res.capped


def test_search_with_a_good_seed_confirms_in_few_trials():
    log: list[int] = []
    res = find_max_batch("examples:mlp", seed=100, trial=fake_trial(120, log))
    # step = 100 // 16 = 6: 100, 106, 112 ok; 112 + max(6, 12) = 124 x; bisect 118 ok, 121 x, 119, 120 ok
    assert log == [100, 106, 112, 124, 118, 121, 119, 120]
    assert res.max_batch_size == 120


def test_search_with_a_seed_that_is_too_high():
    log: list[int] = []
    res = find_max_batch("examples:mlp", seed=100, trial=fake_trial(50, log))
    # 100, 94, 88 (-6), 76 (-12), 52 (-24) fail; 4 (-48) ok; bisect 28, 40, 46, 49, 50 ok, 51 x
    assert log == [100, 94, 88, 76, 52, 4, 28, 40, 46, 49, 50, 51]
    assert res.max_batch_size == 50


def test_search_limit_caps_and_nothing_fits():
    res = search(fake_trial(None), 1, limit=10)
    assert res.batch_sizes_tried == [1, 2, 4, 8, 10]
    assert res.max_batch_size == 10 and res.capped
    res = search(fake_trial(0), 4)
    assert res.batch_sizes_tried == [4, 2, 1]
    assert res.max_batch_size is None


def test_search_stops_on_a_non_oom_error():
    def trial(batch):
        return TrialOutcome("error", 0.0, "ValueError: bad workload") if batch == 4 else TrialOutcome(OK)
    res = search(trial, 1)
    assert res.batch_sizes_tried == [1, 2, 4]
    assert res.max_batch_size == 2
    assert "bad workload" in res.error


def test_find_max_batch_needs_a_spec_and_a_positive_seed():
    with pytest.raises(GpuwiseError):
        find_max_batch(object(), trial=fake_trial(4))
    with pytest.raises(GpuwiseError):
        find_max_batch("examples:mlp", seed=0, trial=fake_trial(4))
    for start in (0, -3):  # `gpuwise measure -b -3 --max-batch`: one line, not a ValueError traceback
        with pytest.raises(GpuwiseError, match="positive"):
            find_max_batch("examples:mlp", start=start, trial=fake_trial(4))


def test_isolated_trials_with_a_real_fake_oom(monkeypatch):
    """Each trial is a spawned child that raises a real torch.OutOfMemoryError above the threshold."""
    monkeypatch.setenv("GPUWISE_FAKE_OOM_ABOVE", "4")
    trial = isolated_trial("examples:mlp", optimizer="sgd", device="cpu", timeout_s=120)
    res = find_max_batch("examples:mlp", seed=4, step=1, trial=trial)
    # the seed 4 runs, 4 + 1 = 5 fails; 5 - 4 = 1: done
    assert res.batch_sizes_tried == [4, 5]
    assert [t.status for t in res.trials] == [OK, OOM]
    assert res.max_batch_size == 4
    assert res.values[4]["batch_size"] == 4 and res.values[4]["oom"] is False
