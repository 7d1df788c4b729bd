"""Memory vs batch size as what it is, piecewise: the model the largest-batch search (plan/capacity.py) starts from.

A training step's peak is the highest of its phases' peaks, and each phase grows differently with the
batch: the optimizer step holds weights, gradients and optimizer state (and its own temporaries) and
barely grows; forward and backward hold the activations, which grow by a fixed amount per sample. So at
small batches the peak sits in the optimizer step and at large ones in backward (or forward), and one line
through the total is wrong on both sides of the bend (17-68 % off in the issue-12 measurements). Here each
phase's steady-step peak of allocated bytes is its own line in the batch size (two traces give every
phase's line at once: the allocator replay reports the peak of every phase), the model is the max of the
lines, and device memory is `outside + ratio * allocated` (context and cuDNN outside the allocator, the
caching allocator's reserved/allocated ratio from the nearest trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_BATCH = 1 << 20          # search ceiling: a million samples per step
DEFAULT_MARGIN_PCT = 5.0     # headroom kept free on the GPU: allocator growth across steps, other libraries
DEFAULT_MAX_TRACES = 16      # traces the search may add to the asked batch's own
SECOND_BATCH_MIN = 64        # the second trace: far enough from small batches that per-sample bytes dominate


@dataclass(frozen=True)
class CurvePoint:
    batch_size: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)  # steady-step allocated peak per phase
    outside_bytes: int = 0   # device_used minus the allocator's reserved: context, cuDNN (constant in b)


@dataclass(frozen=True)
class LinearFit:
    fixed_bytes: float
    per_sample_bytes: float

    def at(self, batch_size: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def largest_within(self, limit_bytes: float) -> int:
        """Largest batch the line keeps within `limit_bytes` (MAX_BATCH when it does not grow)."""
        if self.per_sample_bytes <= 0:
            return MAX_BATCH if self.fixed_bytes <= limit_bytes else 0
        return max(0, min(MAX_BATCH, int((limit_bytes - self.fixed_bytes) // self.per_sample_bytes)))


def fit_line(a: tuple[int, int], b: tuple[int, int]) -> LinearFit:
    """The line through two (batch_size, bytes) points."""
    (x1, y1), (x2, y2) = sorted([a, b])
    if x1 == x2:
        return LinearFit(float(y1), 0.0)
    slope = (y2 - y1) / (x2 - x1)
    return LinearFit(y1 - slope * x1, slope)


def phase_peaks(p: CurvePoint) -> dict[str, int]:
    return p.phase_peak_bytes or {"step": p.peak_allocated_bytes}


def _ratio(p: CurvePoint) -> float:
    """Reserved (+ what the allocator caches) per allocated byte at a traced point."""
    alloc = max(phase_peaks(p).values())
    return (p.device_used_bytes - p.outside_bytes) / alloc if alloc > 0 else 1.0


@dataclass(frozen=True)
class Piecewise:
    """Memory vs batch size as the max of one line per phase (allocated bytes), scaled to device memory."""

    pieces: dict[str, LinearFit]     # phase -> its steady-step peak of allocated bytes vs batch size
    ratio_points: tuple[tuple[int, float], ...]  # (batch, device_used - outside per allocated byte), 1 or 2
    outside_bytes: int

    @property
    def ratio(self) -> float:
        return self.ratio_points[-1][1]

    def ratio_at(self, batch_size: int) -> float:
        """The caching allocator's ratio: interpolated between two traces, held beyond them (its steps
        are not a trend to extrapolate)."""
        (x1, r1), (x2, r2) = self.ratio_points[0], self.ratio_points[-1]
        if x1 == x2 or batch_size <= x1:
            return r1
        if batch_size >= x2:
            return r2
        return r1 + (r2 - r1) * (batch_size - x1) / (x2 - x1)

    def allocated_at(self, batch_size: int) -> float:
        return max(f.at(batch_size) for f in self.pieces.values())

    def phase_at(self, batch_size: int) -> str:
        """The phase whose line is highest at `batch_size`: where the model puts the peak."""
        return max(self.pieces, key=lambda ph: self.pieces[ph].at(batch_size))

    def device_used_at(self, batch_size: int) -> float:
        return self.outside_bytes + self.ratio_at(batch_size) * self.allocated_at(batch_size)

    def largest_within(self, limit_bytes: float) -> int:
        """Largest batch whose modelled device memory stays within `limit_bytes` (bisection on the model,
        which grows with the batch: every line does, or is flat)."""
        if self.device_used_at(MAX_BATCH) <= limit_bytes:
            return MAX_BATCH
        lo, hi = 0, MAX_BATCH          # model(lo) <= limit (or lo = 0), model(hi) > limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.device_used_at(mid) <= limit_bytes:
                lo = mid
            else:
                hi = mid
        return lo

    def device_line(self, batch_size: int) -> LinearFit:
        """The piece that holds the peak at `batch_size`, as a line in device memory."""
        f, r = self.pieces[self.phase_at(batch_size)], self.ratio_at(batch_size)
        return LinearFit(self.outside_bytes + r * f.fixed_bytes, r * f.per_sample_bytes)


def fit_pieces(lo: CurvePoint, hi: CurvePoint, ratio_from: tuple[CurvePoint, ...] = ()) -> Piecewise:
    """One line per phase through two traced points (phases seen in both); the allocator ratio from
    `ratio_from` (one point: held constant; default both: interpolated between them)."""
    a, b = phase_peaks(lo), phase_peaks(hi)
    pieces = {ph: fit_line((lo.batch_size, a[ph]), (hi.batch_size, b[ph])) for ph in a if ph in b}
    if not pieces:  # no phase in common (should not happen): the totals
        pieces = {"step": fit_line((lo.batch_size, max(a.values())), (hi.batch_size, max(b.values())))}
    refs = sorted(ratio_from or (lo, hi), key=lambda p: p.batch_size)
    outside = round(sum(p.outside_bytes for p in refs) / len(refs))
    return Piecewise(pieces, tuple((p.batch_size, max(_ratio(p), 1e-9)) for p in refs), outside)
