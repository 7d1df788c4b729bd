"""Memory vs batch size: the line, the pure search step, and the largest batch on synthetic curves."""

from __future__ import annotations

from gpuwise.plan.capacity import find_capacity, next_candidate
from gpuwise.plan.curve import MAX_BATCH, CurvePoint, fit_line

GIB = 1024**3
MIB = 1024**2


def test_fit_line_through_two_points():
    # 1 GiB fixed + 10 MiB per sample: (8, 1 GiB + 80 MiB), (32, 1 GiB + 320 MiB)
    fit = fit_line((8, GIB + 80 * MIB), (32, GIB + 320 * MIB))
    assert fit.fixed_bytes == GIB and fit.per_sample_bytes == 10 * MIB
    assert fit.at(100) == GIB + 1000 * MIB
    assert fit.largest_within(2 * GIB) == 102                 # (2048 - 1024) MiB / 10 MiB = 102.4
    assert fit_line((4, 100), (8, 100)).largest_within(200) == MAX_BATCH  # flat: no limit from the line


def test_next_candidate_sequence():
    assert next_candidate(16, None) == 32                     # nothing failed yet: double
    assert next_candidate(16, 64) == 40                       # bisect (16 + 64) // 2
    assert next_candidate(16, 17) is None                     # settled
    assert next_candidate(16, 64, guess=50) == 50             # a guess inside the bracket is tried first
    assert next_candidate(16, 64, guess=70) == 40             # ... one outside is ignored
    assert next_candidate(0, 1) is None                       # not even one sample fits


def affine(fixed, per_sample, step=2 * MIB):
    """A synthetic curve rounded up to `step` like allocator segments, counting the traces."""
    calls = []

    def point(b):
        calls.append(b)
        used = -(-(fixed + per_sample * b) // step) * step
        return CurvePoint(b, used, used, used)
    return point, calls


def test_largest_batch_is_exact_and_verified_by_its_neighbour():
    point, calls = affine(3 * GIB, 37 * MIB)
    cap = find_capacity(point, 8, 40 * GIB, margin_pct=5)
    limit = int(40 * GIB * 0.95)
    b = cap.max_batch_size
    assert cap.limit_bytes == limit and cap.settled
    assert point(b).device_used_bytes <= limit < point(b + 1).device_used_bytes
    assert b in calls and b + 1 in calls                      # the answer and its neighbour were traced
    assert cap.traces <= 6 and cap.fits
    assert abs(cap.fit.per_sample_bytes - 37 * MIB) < 2 * MIB


def test_curve_that_bends_upward_is_still_settled_by_tracing():
    # superlinear growth (e.g. attention scores): the line from small batches over-promises
    def point(b):
        used = GIB + 20 * MIB * b + 64 * 1024 * b * b
        return CurvePoint(b, used, used, used)
    cap = find_capacity(point, 4, 24 * GIB, margin_pct=0)
    b = cap.max_batch_size
    assert point(b).device_used_bytes <= 24 * GIB < point(b + 1).device_used_bytes
    assert cap.check_error_pct is not None and cap.check_error_pct < 0   # the line is low at the check point


def test_nothing_fits_gives_zero_and_does_not_fit():
    point, _ = affine(50 * GIB, MIB)
    cap = find_capacity(point, 4, 40 * GIB)
    assert cap.max_batch_size == 0 and not cap.fits and cap.settled
