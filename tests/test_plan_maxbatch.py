"""The largest batch as a piecewise model settled by traces (plan/capacity.py): the peak moves from the optimizer
step to the activations; the answer is b with trace(b) <= limit < trace(b + 1), both traced, in few traces."""

from __future__ import annotations

from pathlib import Path

from gpuwise.plan import estimate
from gpuwise.plan.capacity import find_capacity
from gpuwise.plan.curve import CurvePoint
from gpuwise.plan.memory.events import MemEvent, MemoryTrace
from gpuwise.plan.memory.synth import interpolate, pairing, same_structure
from gpuwise.plan.tracer import trace_workload
from gpuwise.step import StepConfig
from gpuwise.workload import load_workload

GIB = 1024**3
MIB = 1024**2

WORKLOADS = Path(__file__).parent / "workloads"
MLP = str(WORKLOADS / "wide_mlp.py")      # peak in the AdamW step at small batches, in backward at large ones
CONV = str(WORKLOADS / "small_conv.py")


def two_phase(opt_bytes, fixed_bytes, per_sample_bytes, step=2 * MIB, outside=500 * MIB):
    """Synthetic step: the optimizer phase flat at `opt_bytes`, backward `fixed + per_sample * b`; device
    memory rounded up to `step` like allocator segments. Counts the traces."""
    calls = []

    def point(b):
        calls.append(b)
        phases = {"optimizer": opt_bytes + 1000 * b, "backward": fixed_bytes + per_sample_bytes * b}
        alloc = max(phases.values())
        used = -(-alloc // step) * step + outside
        return CurvePoint(b, alloc, used - outside, used, phases, outside)
    return point, calls


def test_piecewise_model_predicts_past_the_bend_where_one_line_cannot():
    # small batches: the peak is the flat optimizer step (3 GiB); large: backward, 20 MiB per sample
    point, calls = two_phase(3 * GIB, GIB, 20 * MIB)
    cap = find_capacity(point, 8, 40 * GIB, margin_pct=5)
    b, limit = cap.max_batch_size, int(40 * GIB * 0.95)
    assert point(b).device_used_bytes <= limit < point(b + 1).device_used_bytes
    assert cap.settled and b in calls and b + 1 in calls
    assert point(8).phase_peak_bytes["optimizer"] > point(8).phase_peak_bytes["backward"]
    assert cap.peak_phase == "backward" and cap.model.phase_at(b) == "backward"
    assert abs(cap.prediction_error_pct) < 1          # the backward line is exact from two traces
    assert cap.line_max_batch_size > 10 * b           # one line through the totals: flat, far too high
    assert cap.traces <= 5                            # 64, the prediction, its neighbours
    assert cap.to_dict()["pieces"]["backward"]["per_sample_bytes"] == 20 * MIB


def test_curve_that_is_not_monotone_is_still_settled_at_a_traced_crossing():
    # memory dips after a step (allocator layout): the answer is a b that fits with b + 1 over, both traced
    def point(b):
        used = GIB + 10 * MIB * b + (300 * MIB if b % 50 >= 40 else 0)
        return CurvePoint(b, used, used, used, {"backward": used})
    cap = find_capacity(point, 4, 8 * GIB, margin_pct=0)
    b = cap.max_batch_size
    assert cap.settled and point(b).device_used_bytes <= 8 * GIB < point(b + 1).device_used_bytes
    assert cap.traces <= 10


def test_trace_budget_gives_a_lower_bound_and_says_so():
    def point(b):
        used = GIB + 10 * MIB * b + 64 * 1024 * b * b   # curving: the lines keep over-promising
        return CurvePoint(b, used, used, used, {"backward": used})
    cap = find_capacity(point, 4, 24 * GIB, margin_pct=0, max_traces=2)
    assert not cap.settled and cap.traces == 2 and cap.max_traces == 2
    assert point(cap.max_batch_size).device_used_bytes <= 24 * GIB


def test_asked_batch_that_does_not_fit_shrinks():
    point, calls = two_phase(GIB, GIB, 100 * MIB)
    cap = find_capacity(point, 512, 16 * GIB, margin_pct=0)
    b = cap.max_batch_size
    assert not cap.fits and 0 < b < 512 and cap.settled
    assert point(b).device_used_bytes <= 16 * GIB < point(b + 1).device_used_bytes


def test_mlp_peak_moves_from_optimizer_to_backward_and_the_answer_is_exact():
    est = estimate(MLP, 8, gpu="1GiB")
    assert est.peak_phase == "optimizer"              # at 8: weights + grads + AdamW state and temporaries
    cap, b = est.capacity, est.max_batch_size
    assert cap.settled and cap.peak_phase == "backward" and b > 1000
    at_b = estimate(MLP, b, gpu="1GiB", search_max_batch=False)
    above = estimate(MLP, b + 1, gpu="1GiB", search_max_batch=False)
    assert at_b.device_used_bytes <= cap.limit_bytes < above.device_used_bytes
    # 64, then b and b + 1 found among allocator replays of interpolated traces: exact here
    assert cap.traces == 3 and cap.replay_predicted_max_batch_size == b and cap.replays > 0
    d = est.to_dict()["curve"]
    assert {"optimizer", "backward"} <= set(d["pieces"]) and d["traces"] == cap.traces
    assert d["predicted_max_batch_size"] and d["max_traces"] == 16 and d["replay_prediction_error_pct"] == 0


def test_conv_net_answer_is_exact():
    est = estimate(CONV, 8, gpu="1GiB")
    cap, b = est.capacity, est.max_batch_size
    assert cap.settled and b > 64
    at_b = estimate(CONV, b, gpu="1GiB", search_max_batch=False)
    above = estimate(CONV, b + 1, gpu="1GiB", search_max_batch=False)
    assert at_b.device_used_bytes <= cap.limit_bytes < above.device_used_bytes
    assert cap.traces <= 4


def test_interpolated_trace_is_the_real_trace_where_sizes_are_affine():
    wl, cfg = load_workload(MLP), StepConfig()
    t8, t64, t1000 = (trace_workload(wl, b, cfg, "cuda") for b in (8, 64, 1000))
    assert same_structure(t8, t64) and same_structure(t8, t1000)
    synth = interpolate(t8, 8, t64, 64, 1000)
    assert [e.nbytes for e in synth.events] == [e.nbytes for e in t1000.events]
    assert not same_structure(t8, MemoryTrace(t8.events[:-1], t8.steady_start, "cuda"))  # an event fewer


def test_replays_that_miss_fall_back_to_traces_and_the_answer_stays_exact():
    point, calls = two_phase(3 * GIB, GIB, 20 * MIB)

    def off_by_3pct(b, a, c):     # a replay whose sizes are not the real ones (non-affine kernels)
        p = point(b)
        calls.pop()
        used = int(p.device_used_bytes * 0.97)
        return CurvePoint(b, used, used, used, p.phase_peak_bytes, p.outside_bytes)

    cap = find_capacity(point, 8, 40 * GIB, margin_pct=5, replayed=off_by_3pct)
    b, limit = cap.max_batch_size, int(40 * GIB * 0.95)
    assert cap.settled and point(b).device_used_bytes <= limit < point(b + 1).device_used_bytes
    assert cap.traces <= 8 and cap.replays > 0


def test_traces_of_different_structure_are_not_replayed():
    point, _ = two_phase(3 * GIB, GIB, 20 * MIB)
    cap = find_capacity(point, 8, 40 * GIB, margin_pct=5, replayed=lambda b, a, c: None)
    assert cap.settled and cap.replay_predicted_max_batch_size is None
    assert point(cap.max_batch_size).device_used_bytes <= cap.limit_bytes < point(cap.max_batch_size + 1).device_used_bytes


def test_pairing_allows_a_run_of_frees_in_another_order_but_not_a_free_moved_past_an_allocation():
    def trace(sizes, frees, tail):
        ev = [MemEvent("alloc", i, n, "activations", "forward") for i, n in enumerate(sizes)]
        ev += [MemEvent("free", i, sizes[i], "activations", "forward") for i in frees]
        ev += [MemEvent(*e) for e in tail]
        return MemoryTrace(ev, 0, "cuda")

    a = trace([100, 200, 300], [0, 1, 2], [])
    c = trace([1000, 2000, 3000], [2, 0, 1], [])             # the autocast cache cleared in another order
    assert pairing(a, c) == {0: 0, 1: 1, 2: 2}
    mid = interpolate(a, 1, c, 10, 4)                        # sizes on their lines: 100 b, 200 b, 300 b
    assert [e.nbytes for e in mid.events] == [400, 800, 1200, 400, 800, 1200]
    moved = trace([100, 200, 300], [0, 1], [("free", 2, 300, "activations", "forward")])
    late = MemoryTrace(moved.events[:3] + moved.events[3:4] + [MemEvent("alloc", 9, 5, "temporary", "forward")]
                       + moved.events[4:], 0, "cuda")
    early = MemoryTrace(moved.events[:5] + [MemEvent("alloc", 9, 5, "temporary", "forward")], 0, "cuda")
    assert pairing(late, early) is None                     # a free on the other side of an allocation
