"""The CUDA memory snapshot -> MemoryTrace converter, on a small synthetic snapshot in torch's format."""

from __future__ import annotations

import pickle

from gpuwise.measuring import snapshot
from gpuwise.plan.memory.events import live_peak

USER = [{"filename": "/home/me/job.py", "line": 12, "name": "loss"},
        {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"}]


def entry(action, addr, size, frames=None):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames or []}


# one warm-up-free step after setup, in the format of torch.cuda.memory._snapshot() (device 0's trace)
SNAP = {
    "segments": [],
    "device_traces": [[
        entry("alloc", 10, 512),                 # 0 setup: a parameter, never freed
        entry("alloc", 20, 100),                 # 1 between steps: the batch copy (inputs)
        entry("alloc", 30, 1000, USER),          # 2 forward: an activation
        entry("segment_alloc", 0x1000, 2 << 20),  # 3 ignored: the allocator's own cudaMalloc
        entry("alloc", 40, 512),                 # 4 backward: a gradient
        entry("free_requested", 30, 1000),       # 5 backward frees the activation
        entry("free_completed", 30, 1000),       # 6 ignored (the free of 5 completing)
        entry("alloc", 50, 1024),                # 7 optimizer: state, never freed
        entry("free_requested", 99, 64),         # 8 a block allocated before recording started
        entry("free_requested", 40, 512),        # 9 zero_grad(set_to_none) drops the gradient
        entry("free_requested", 20, 100),        # 10 the batch goes at the end of the step
    ]],
    "gpuwise": {"device": 0, "steady_start": 1,
                "phase_marks": [[1, "zero_grad"], [2, "forward"], [4, "backward"], [7, "optimizer"], [9, "zero_grad"]]},
}


def test_to_trace_events_blocks_and_categories():
    trace = snapshot.to_trace(SNAP)
    assert trace.method == "cuda-snapshot" and trace.device_type == "cuda"
    got = [(e.action, e.nbytes, e.category, e.phase) for e in trace.events]
    assert got == [
        ("alloc", 64, "temporary", "setup"),          # synthesised: freed but never seen allocated
        ("alloc", 512, "parameters", "setup"),
        ("alloc", 100, "inputs", "forward"),
        ("alloc", 1000, "activations", "forward"),
        ("alloc", 512, "gradients", "backward"),
        ("free", 1000, "activations", "backward"),
        ("alloc", 1024, "optimizer_state", "optimizer"),
        ("free", 64, "temporary", "optimizer"),
        ("free", 512, "gradients", "zero_grad"),
        ("free", 100, "inputs", "zero_grad"),
    ]
    assert trace.steady_start == 2  # the synthesised alloc and the parameter come before entry 1
    assert trace.events[3].op == "loss (job.py:12)"  # the innermost frame outside torch
    assert len({e.block for e in trace.events if e.action == "alloc"}) == 6
    assert any("before recording" in n for n in trace.notes)


def test_live_peak_of_the_converted_trace():
    peak = live_peak(snapshot.to_trace(SNAP))
    # running total: 64, 576, 676, 1676, 2188, 1188, 2212 (peak, at the optimizer's 1,024 B alloc) ...
    assert peak.allocated_bytes == 64 + 512 + 100 + 512 + 1024
    assert peak.phase == "optimizer"
    assert peak.by_category["optimizer_state"] == 1024 and peak.by_category["gradients"] == 512
    assert peak.by_category["activations"] == 0 and peak.by_category["inputs"] == 100


def test_reuse_of_an_address_makes_a_new_block_and_no_marks_fall_back_to_frames():
    opt = [{"filename": "/x/site-packages/torch/optim/adamw.py", "line": 5, "name": "_single_tensor_adamw"}]
    snap = {"device_traces": [[entry("alloc", 1, 8, USER), entry("free_requested", 1, 8),
                               entry("alloc", 1, 16, opt)]]}
    trace = snapshot.to_trace(snap)
    assert [e.block for e in trace.events] == [0, 0, 1]
    assert [e.phase for e in trace.events] == ["forward", "forward", "optimizer"]
    assert trace.events[2].category == "optimizer_state"
    assert trace.steady_start == 0 and trace.notes


def test_compare_a_trace_with_itself_and_a_pickled_round_trip(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(SNAP))
    trace = snapshot.to_trace(snapshot.load(str(path)))
    cmp = snapshot.compare(trace, trace)
    assert cmp.matched_allocs == cmp.measured_allocs == 4  # the steady step's four allocations
    assert cmp.peak_error == 0.0
    assert cmp.by_phase_bytes["forward"] == (1100, 1100)


def test_phase_marks_follow_the_step_on_cpu(monkeypatch):
    """The hooks that mark phase boundaries while recording fire in step order (trace length faked)."""
    from itertools import count

    from gpuwise.step import StepConfig, TrainStep
    from gpuwise.workload import load_workload

    ticks = count()
    monkeypatch.setattr(snapshot.PhaseMarks, "trace_length", lambda self: next(ticks))
    wl = load_workload("examples:mlp")
    step = TrainStep(wl, StepConfig(optimizer="sgd"), "cpu")
    marks = snapshot.PhaseMarks(step, 0)
    batch = wl.build_batch(4)
    step.step(batch)
    step.step(batch)
    phases = ["forward", "backward", "optimizer", "zero_grad"]
    assert marks.marks == list(enumerate(phases * 2))
    assert wl.compute_loss is not step.workload.compute_loss  # only the step's copy is wrapped
    marks.remove()
    step.step(batch)
    assert len(marks.marks) == 8 and step.workload is wl  # unhooked: nothing more is marked


def test_cli_snapshot_summary(tmp_path):
    from gpuwise.commands.measure import _snapshot_summary

    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(SNAP))
    summary = _snapshot_summary(str(path))
    assert summary["events"] == 10 and summary["steady_peak_bytes"] == 2212 and summary["peak_phase"] == "optimizer"
    assert "could not convert" in _snapshot_summary(str(tmp_path / "missing.pickle"))["error"]
