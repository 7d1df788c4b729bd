"""`gpuwise fit`: ranked options with memory and speed; layer extrapolation vs full-depth traces; sharding."""

import contextlib
import json
import re
import subprocess
import sys

import pytest

from gpuwise.cli import main
from gpuwise.contracts import SCHEMA_VERSION, validate
from gpuwise.hf import hf_workload
from gpuwise.plan.fit import fit
from gpuwise.plan.memory.sharding import shard_trace
from gpuwise.plan.memory.split import Split
from gpuwise.plan.point import phase_peaks
from gpuwise.plan.scaled import Evaluator
from gpuwise.plan.tracing.modes import TrainingModes
from gpuwise.step import StepConfig

TINY = "tests/data/configs/tiny-llama.json"
LLAMA_7B = "examples/configs/llama-2-7b.json"
OPTION_KEYS = {"name", "changes", "fits", "device_used_bytes", "samples_per_s", "effective_batch_size", "notes",
               "estimate_cmd", "train_cmd"}  # estimate_cmd: issue 20; train_cmd: issue 24 (extend-only)


@pytest.mark.parametrize("config,modes,split", [
    (StepConfig("adamw", "bf16", True), TrainingModes(), Split("fsdp", 4)),
    (StepConfig("adamw8bit", "bf16", False), TrainingModes(grad_accum=2), Split("zero1", 4)),
])
def test_layer_extrapolation_matches_a_full_depth_trace(config, modes, split):
    ev = Evaluator(hf_workload(TINY, 32, num_layers=5), "hopper")
    assert ev.layers == 5
    extrapolated = ev.evaluate(2, config, modes, split)
    full = ev._point(ev.trace(None, 2, config, modes), modes, split, extrapolated.block_param_bytes)
    # live bytes: exact but for the 512-byte rounding of sharded pieces; under FSDP the full-depth backward
    # peaks in the second-to-last block (FSDP2 holds 4 blocks in a middle block, 3 in the last, 1 after it),
    # which 1- and 2-layer traces cannot place: the extrapolation stands the last block in for it, and
    # counts one more block's sharded gradients (1.2 % over here, never under)
    over = extrapolated.peak_allocated_bytes - full.peak_allocated_bytes
    assert -0.005 * full.peak_allocated_bytes <= over <= (0.015 if split.strategy == "fsdp" else 0.005) * \
        full.peak_allocated_bytes
    assert abs(extrapolated.device_used_bytes - full.device_used_bytes) <= 0.10 * full.device_used_bytes


def test_sharding_shrinks_per_rank_state_in_order():
    ev = Evaluator(TINY, "hopper")
    trace = ev.trace(None, 2, StepConfig("adamw", "fp32", False), TrainingModes())
    peaks = {s: max(b for b, _ in phase_peaks(shard_trace(trace, Split(s, 4), 4096, 10**6))[0].values())
             for s in ("single", "ddp", "zero1", "zero2", "fsdp")}
    assert peaks["ddp"] > peaks["single"] > peaks["zero1"] > peaks["zero2"] > peaks["fsdp"]


def test_fit_ranks_fitting_options_first_then_fastest():
    result = fit(TINY, "L4", 2, 8, seq_len=32)
    d = result.to_dict()
    assert set(d) == {"workload", "gpu", "nproc", "options"} and d["nproc"] == 2
    assert all(set(o) == OPTION_KEYS for o in d["options"])
    validate("fit", {"schema_version": SCHEMA_VERSION, **d})
    fits = [o.fits for o in result.options]
    assert fits == sorted(fits, reverse=True)
    fitting = [o.samples_per_s for o in result.options if o.fits]
    assert fitting == sorted(fitting, reverse=True)
    names = " ".join(o.name for o in result.options)
    for word in ("checkpointing", "8-bit AdamW", "Adafactor", "LoRA", "QLoRA", "offload", "fsdp", "zero2", "ddp",
                 "pipeline"):
        assert word in names


def test_7b_on_24gb_full_finetune_does_not_fit_qlora_does():
    result = fit(LLAMA_7B, "rtx4090", 1, 4, seq_len=512, precision="bf16")
    by_name = {o.name.split(" + accumulation")[0]: o for o in result.options}
    assert not by_name["as given"].fits  # 7B x (4 weights + 4 grads + 8 AdamW) bytes is far above 24 GB
    assert by_name["QLoRA r16 (bf16) + checkpointing"].fits
    assert 4e9 < by_name["QLoRA r16 (bf16) + checkpointing"].device_used_bytes < 16e9
    assert result.traces <= 40


def test_cli_all_gpus_json_and_plot(tmp_path, capsys, monkeypatch):
    import gpuwise.commands.fit as command

    stages: list[str] = []

    class Heard(list):  # the stages the CLI's StageProgress would print (after 2 s) on stderr
        def __init__(self, prefix):
            super().__init__()

        def __enter__(self):
            return stages.append

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(command, "StageProgress", Heard)
    png = tmp_path / "fit.png"
    assert main(["fit", TINY, "--gpu", "all", "-b", "4", "--seq-len", "16", "--json", "--plot", str(png)]) == 0
    d = json.loads(capsys.readouterr().out)
    validate("fit", d)
    assert len(d["gpus"]) >= 10 and all(set(g) == {"workload", "gpu", "nproc", "options"} for g in d["gpus"])
    n = len(d["gpus"])  # the side-by-side traces (every GPU's), then one stage per GPU, in order
    side = f"{n} GPUs' options: the traces, side by side"
    told = [s for s in stages if s.startswith(side)]
    assert stages[:len(told)] == told and told[0] == side
    assert all(re.fullmatch(re.escape(side) + r", \d+ traces so far", s) for s in told[1:])
    assert list(dict.fromkeys(stages[len(told):])) == [f"GPU {i}/{n}, {g['gpu']}" for i, g in enumerate(d["gpus"], 1)]
    assert png.stat().st_size > 10_000
    t4 = next(g for g in d["gpus"] if g["gpu"] == "Tesla T4")
    assert all("bf16" not in o["name"] for o in t4["options"])  # no bf16 tensor cores on a T4: fp16 offered


def test_cli_bad_gpu_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "gpuwise", "fit", TINY, "--gpu", "nope-9000"],
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": "src", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


BN_NET = '''
import torch
from torch import nn

def model():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))

def batch(batch_size):
    return torch.randn(batch_size, 3, 8, 8), torch.randint(0, 2, (batch_size,))

def loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
'''


def test_the_accumulation_note_names_batchnorm_only_when_the_step_runs_it(tmp_path):
    bn = tmp_path / "bn.py"
    bn.write_text(BN_NET)
    accum = TrainingModes(grad_accum=2)
    config = StepConfig("adamw", "fp32", False)
    with_bn = Evaluator(str(bn), "hopper").evaluate(2, config, accum, Split("single", 1))
    without = Evaluator(TINY, "hopper").evaluate(2, config, accum, Split("single", 1))
    assert with_bn.batch_norm and not without.batch_norm


def _deep_tiny(tmp_path, layers: int = 6) -> str:
    path = tmp_path / f"tiny{layers}.json"
    path.write_text(json.dumps({**json.load(open(TINY)), "num_hidden_layers": layers}))
    return str(path)


def test_fit_options_are_what_their_estimate_cmd_gives(tmp_path, capsys):
    """fit rebuilds a deep config as estimate does (3- and 4-block traces): the top options' bytes are the
    bytes their `estimate_cmd` prints, to the byte. It says which option it is sizing."""
    import gc
    import shlex

    stages: list[str] = []
    collecting: set[bool] = set()
    result = fit(_deep_tiny(tmp_path), "rtx4090", 1, 2, seq_len=16, precision="bf16",
                 progress=lambda stage: stages.append(stage) or collecting.add(gc.isenabled()))
    assert collecting == {False} and gc.isenabled()  # the cyclic collector paused while fit runs, then back
    # `progress` (the CLI prints it on stderr after 2 s): loading, then each traced option as its sizing starts
    assert stages[0] == "loading the workload and its libraries"
    assert all(s.startswith("NVIDIA GeForce RTX 4090: ") for s in stages[1:])
    assert {s.split(", ", 1)[1] for s in stages if ": option " in s} == \
        {o.name.split(" + accumulation")[0] for o in result.options if not o.floor_only and o.sized}
    top = [o for o in result.options if o.fits and o.estimate_cmd][:3]
    assert len(top) == 3
    for o in top:
        assert not any(n.startswith("numbers from") for n in o.notes), o.notes  # no extrapolation here
        assert main(shlex.split(o.estimate_cmd)[1:] + ["--json"]) == 0
        est = json.loads(capsys.readouterr().out)
        assert any("repeated blocks: traced with 3 and 4 of 6 blocks" in n for n in est["notes"])
        assert est["device_used_bytes"] == o.device_used_bytes, o.name


def test_fit_with_training_metrics_gives_what_its_estimate_cmds_give(tmp_path, capsys):
    """fit --train-metrics 2 (Composer's metrics over the logits after each backward): every option carries them,
    its JSON is in the contract, and its top options' estimate_cmd gives its bytes and speed."""
    import shlex

    result = fit(_deep_tiny(tmp_path), "rtx4090", 1, 2, seq_len=16, precision="bf16", cross_entropy="fused",
                 train_metrics=2)
    d = result.to_dict()
    validate("fit", {"schema_version": SCHEMA_VERSION, **d})
    assert all(o["changes"]["train_metrics"] == 2 and o["train_cmd"] is None for o in d["options"])
    top = [o for o in result.options if o.fits and o.estimate_cmd][:2]
    assert len(top) == 2
    for o in top:
        assert main(shlex.split(o.estimate_cmd)[1:] + ["--json"]) == 0
        est = json.loads(capsys.readouterr().out)
        assert est["device_used_bytes"] == o.device_used_bytes, o.name
        assert est["speed"]["samples_per_s"] == pytest.approx(o.samples_per_s, rel=1e-6), o.name


def test_multi_gpu_options_have_their_estimate_cmds_speed(tmp_path, capsys):
    """An FSDP option's speed carries FSDP's copies around its collectives (plan/speed/fsdp_kernels.py) as its
    `estimate_cmd` prices them: the same samples/s, as well as the same bytes, for every sharded option."""
    import shlex

    # wide enough that the step is GPU-bound on an H100 (a tiny one waits for the host, where FSDP's copies hide)
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps({**json.load(open(TINY)), "hidden_size": 2048, "intermediate_size": 5632,
                                "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 5,
                                "vocab_size": 8192, "max_position_embeddings": 1024}))
    result = fit(str(wide), "H100", 8, 8, seq_len=512, precision="bf16")
    sharded = [o for o in result.options if o.fits and o.estimate_cmd and "fsdp" in o.name]
    assert sharded
    for o in sharded:
        assert main(shlex.split(o.estimate_cmd)[1:] + ["--json"]) == 0
        est = json.loads(capsys.readouterr().out)
        assert est["device_used_bytes"] == o.device_used_bytes, o.name
        # the same to 1e-6: fit takes the gathered parameters' bytes from its point's peak breakdown, estimate from
        # the rank's trace at its peak (512-byte rounding); without FSDP's copies in fit they differed by ~10 %
        assert est["speed"]["samples_per_s"] == pytest.approx(o.samples_per_s, rel=1e-6), o.name


def test_a_step_the_rebuild_does_not_cover_is_extrapolated_and_says_so(tmp_path):
    """Adafactor (its factored state's frees do not pair up block by block): the 4-block trace is not
    its rebuild, so estimate swaps its steps into AdamW's rebuilt step (exact: the step traced whole); fit, where it cannot swap Adafactor's steps into AdamW's step
    (as after that swap's check failed: tests/test_plan_optimizer_swap.py), extrapolates from the 3- and 4-block
    traces (no whole trace) and labels the option."""
    ev = Evaluator(_deep_tiny(tmp_path), "hopper")
    config, modes = StepConfig("adafactor", "bf16", False), TrainingModes()
    ev._no_swap.add(ev._steps_key(None, config, modes))  # what a failed swap check leaves
    point = ev.evaluate(2, config, modes, Split())
    assert any(n.startswith("numbers from traces with 3 and 4 of 6 layers") and "not rebuilt exactly" in n
               for n in point.notes), point.notes
    assert ev.traces_run == 2
    full = ev._point(ev.trace(None, 2, config, modes), modes, Split(), point.block_param_bytes)
    assert abs(point.device_used_bytes - full.device_used_bytes) <= 0.05 * full.device_used_bytes
    # fit's answer for such a step is traced whole, as estimate traces it: the same bytes
    from gpuwise.plan import estimate

    est = estimate(_deep_tiny(tmp_path), 2, "adafactor", "bf16", search_max_batch=False)
    assert any("adafactor's own step: repeated blocks not reused" in n for n in est.notes)  # estimate swaps
    assert ev.evaluate(2, config, modes, Split(), whole=True).device_used_bytes == est.device_used_bytes


def test_gpus_whose_attention_kernels_agree_share_traces():
    from gpuwise.plan.tracing.sdpa import kernel_class

    assert kernel_class((8, 0)) == kernel_class((9, 0))  # A100 and H100: the same SDPA rules pass
    assert len({kernel_class(c) for c in ((7, 0), (7, 5), (8, 0), (8, 9), (9, 0))}) == 3  # V100 = T4, L4 apart


def test_a_trace_is_shared_by_gpus_that_run_its_attention_calls_alike(tmp_path):
    """An L4 (sm89) is another attention class than an A100 (sm80) only for flash backward with head dims
    over 192: for a model with smaller heads the A100's trace is the L4's, not traced again, and gives the
    bytes a trace of its own gives; the same architecture's workspaces replay once. A V100 (sm70, no flash,
    no bf16 in memory-efficient attention) runs other kernels: traced again."""
    import torch

    from gpuwise.plan.tracing.sdpa import SdpaCall, TensorMeta, same_kernels

    def call(head_dim):
        q = TensorMeta((2, 4, 16, head_dim), torch.bfloat16, True)
        return SdpaCall(q, q, q, None, False, None)

    assert same_kernels([call(128)], (8, 0), (8, 9)) and same_kernels([call(128)], (9, 0), (12, 0))
    assert not same_kernels([call(256)], (8, 0), (8, 9))  # flash backward there takes head dim <= 192
    assert not same_kernels([call(128)], (8, 0), (7, 0))
    assert same_kernels([], (8, 0), (7, 0))  # no attention call: any GPU's trace is the same

    source = _deep_tiny(tmp_path)
    config, modes = StepConfig("adamw", "bf16", False), TrainingModes()
    ev = Evaluator(source, "ampere", (8, 0))
    first = ev.evaluate(2, config, modes, Split())
    assert ev.traces_run == 2
    for arch, capability in (("ada", (8, 9)), ("ampere", (8, 6))):
        ev.arch, ev.capability = arch, capability
        shared = ev.evaluate(2, config, modes, Split())
        assert ev.traces_run == 2
        own = Evaluator(source, arch, capability).evaluate(2, config, modes, Split())
        assert shared.device_used_bytes == own.device_used_bytes
        assert shared.peak_allocated_bytes == own.peak_allocated_bytes == first.peak_allocated_bytes
    ev.arch, ev.capability = "volta", (7, 0)
    assert ev.evaluate(2, config, modes, Split()).device_used_bytes == \
        Evaluator(source, "volta", (7, 0)).evaluate(2, config, modes, Split()).device_used_bytes
    assert ev.traces_run == 4


def test_options_whose_parameters_and_gradients_exceed_the_card_are_not_traced(tmp_path):
    """A full fine-tune holds every parameter, its gradient and its optimizer state at the end of backward:
    where that floor is over the card, the option is reported as not fitting, with the floor, and not
    traced. The floor is under the traced peak of each such step (so "does not fit" is true), and the other
    options are traced."""
    from dataclasses import replace as with_

    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit import state_floor, variants

    source = _deep_tiny(tmp_path)
    ev = Evaluator(source, "ada")
    full = 8 * ev.parameter_count()  # fp32 weights and gradients (AdamW: twice that)
    spec = with_(lookup("rtx4090"), memory_bytes=int(full / 0.95))  # under AdamW's floor, over bf16-pure's
    result = fit(source, spec, 1, 2, seq_len=16, evaluator=Evaluator(source, "ada"))
    floored = [o for o in result.options if o.floor_only]
    assert floored and all(not o.fits and o.samples_per_s == 0 and o.notes[0].startswith("not traced") and
                           o.estimate_cmd for o in floored)
    assert any(o.name.startswith("pure bf16") and not o.floor_only for o in result.options)  # half the floor: traced
    check = Evaluator(source, spec.arch)
    for v in variants(spec, 1, "fp32", None, False):
        floor = state_floor(check, v)
        if floor is None:
            continue
        point = check.evaluate(1, v.config, with_(v.modes, grad_accum=2), v.split)
        assert point.peak_allocated_bytes >= floor, v.name
        limit = spec.memory_bytes * 0.95  # the default 5 % margin
        option = next(o for o in result.options if o.name.split(" + accumulation")[0] == v.name)
        assert option.floor_only == (floor > limit), v.name
        if option.floor_only:
            assert point.device_used_bytes > limit  # the verdict the floor gave is the trace's


def test_traces_run_side_by_side_give_the_same_answers(tmp_path, monkeypatch):
    """fit's first traces in forked workers (one per idle CPU) or one by one here: the same options."""
    from gpuwise.plan import forks

    source = _deep_tiny(tmp_path)
    answers = []
    for cpus in (1, 2):
        monkeypatch.setattr(forks, "idle_cpus", lambda cpus=cpus: cpus)
        result = fit(source, "rtx4090", 1, 2, seq_len=16, precision="bf16")
        answers.append((result.to_dict(), result.traces))
    assert answers[0] == answers[1]
    # the search's micro-batches of an adapter variant, forked or here: the same events
    from gpuwise.plan.tracing.repeat import canonical

    config = StepConfig("adamw", "bf16", False)
    asks = [(m, config, TrainingModes(lora_rank=8, grad_accum=4 // m), Split()) for m in (1, 2, 4)]
    forked, here = Evaluator(source, "ada"), Evaluator(source, "ada")
    forked.prefetch(asks, workers=2)
    # micro-batches 1 and 2 are one step (two micro-steps traced): its 4-block check runs at one of them only
    assert forked.traces_run == 5
    for m, c, modes, _ in asks:
        assert canonical(forked.rebuilt(None, m, c, modes)) == canonical(here.rebuilt(None, m, c, modes))
    assert forked.traces_run == here.traces_run


def test_the_load_of_fits_own_forks_does_not_stop_it_forking(monkeypatch):
    """idle_cpus: the 1-minute load average that fit's own forks raised is not another's work. On 2 idle CPUs,
    after 60 s of two forks busy (load 1.9, nearly all of it this process's), fit still forks for two; with
    another process busy beside it as well (load 2.9), one."""
    import os
    import time
    from types import SimpleNamespace

    from gpuwise.plan import forks

    clock = {"t": 0.0, "cpu": 0.0, "load": 0.0, "others": 0}
    monkeypatch.setattr(forks, "_OWN", [])
    monkeypatch.setattr(forks, "_others_running", lambda: clock["others"])  # between rounds: no fork running
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (clock["load"], 0.0, 0.0))
    monkeypatch.setattr(os, "times", lambda: SimpleNamespace(user=clock["cpu"], system=0.0, children_user=0.0,
                                                             children_system=0.0))
    monkeypatch.setattr(time, "monotonic", lambda: clock["t"])
    assert forks.idle_cpus() == 2                  # an idle machine, fit just started
    clock.update(t=60.0, cpu=120.0, load=1.9)       # a minute of its two forks: 2 CPU-seconds a second
    assert forks.idle_cpus() == 2
    clock.update(t=61.0, cpu=122.0, load=2.9, others=1)  # and another process busy since
    assert forks.idle_cpus() == 1


def test_a_step_that_would_leave_a_worker_idle_is_traced_as_two_tasks():
    """Forks' tasks: a step is one task; where the steps are fewer than the idle workers, the last rebuilt ones
    become their 4- and 3-block traces (the side-by-side test above runs both kinds)."""
    from gpuwise.plan.forks import fork_tasks

    assert fork_tasks(["a", "b"], {"a", "b"}, 2) == [("a", None), ("b", None)]
    assert fork_tasks(["a", "b", "c"], {"a", "b", "c"}, 2) == [("a", None), ("b", None), ("c", None)]
    assert fork_tasks(["a"], {"a"}, 2) == [("a", 4), ("a", 3)]          # one step: both workers busy
    assert fork_tasks(["a"], {"a"}, 0) == [("a", None)]                 # none idle: the next to free up takes it
    assert fork_tasks(["a", "b"], {"a"}, 4) == [("b", None), ("a", 4), ("a", 3)]
    assert fork_tasks(["a", "b"], set(), 4) == [("a", None), ("b", None)]  # nothing to split
    assert fork_tasks(["a", "b", "c"], {"a", "b", "c"}, 5) == [("a", None), ("c", 4), ("c", 3), ("b", 4), ("b", 3)]


class _Workers:
    """A stand-in `Forks`: what is handed out comes back at the next wait (a round); a spare ask is handed out
    only to a worker that would idle."""

    def __init__(self, ev, workers):
        self.ev, self.workers, self.flown = ev, workers, []

    @property
    def needed(self):
        return len(self.flown)

    def flying(self, ask):
        return False

    def submit(self, asks, spare=False):
        self.flown += asks[:max(self.workers - len(self.flown), 0)] if spare else asks

    def wait(self):
        self.ev.rounds.append(sorted((a[2].lora_rank, a[0]) for a in self.flown))
        for a in self.flown:
            self.ev.kept.add(self.ev.key(*a))
            self.ev.traces_run += 1
        self.flown = []


class _Traces:
    """A stand-in Evaluator: a step's bytes are `used(variant's modes, micro-batch)`; it records which trials
    were traced one at a time (`evaluate`) and which side by side (`forks`, only with `cpus` > 1)."""

    layers = None

    def __init__(self, used, cpus: int):
        self.used, self.cpus, self.kept, self.one_by_one, self.rounds, self.traces_run = used, cpus, set(), [], [], 0

    @staticmethod
    def key(micro, config, modes, split):
        return micro, tuple(sorted(vars(config).items())), modes, split

    def traced(self, *ask, whole=False):
        return self.key(*ask) in self.kept

    @contextlib.contextmanager
    def forks(self, workers, modes, configs):
        yield _Workers(self, workers) if self.cpus > 1 else None

    def evaluate(self, micro, config, modes, split, whole=False):
        from gpuwise.plan.point import Point

        if self.key(micro, config, modes, split) not in self.kept:
            self.kept.add(self.key(micro, config, modes, split))
            self.one_by_one.append((modes.lora_rank, micro))
            self.traces_run += 1
        b = self.used(modes, micro)
        return Point(b, b, {"activations": b}, flops_per_step=10**12 * micro)


def test_the_searches_later_trials_are_traced_side_by_side_with_the_same_answers(monkeypatch):
    """fit's searches run side by side (_side_by_side): every search's next trial is handed to the workers with
    the others' (Forks.submit), not traced one at a time when the search asks it; the same trials are traced (a
    likely next one beside them only on a worker that would idle) and the answers are those of the searches run
    one by one (no workers: one CPU). The stand-in's workers give back everything handed out at each wait."""
    from dataclasses import replace

    from gpuwise.plan import side_by_side as fit_searches
    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit import _side_by_side, best_micro_batch, variants

    monkeypatch.setattr(fit_searches, "idle_cpus", lambda: 2)
    spec = lookup("rtx4090")
    # three searches: LoRA r16 whole batch first (fits up to 2), rank 4 micro-batch 1 first (fits up to 4),
    # and a rank-8 one micro-batch 1 first that fits at 8 (two trials)
    base = variants(spec, 1, "fp32", None, False)[0]
    searched = [(replace(base, modes=replace(base.modes, lora_rank=r)), whole)
                for r, whole in ((16, True), (4, False), (8, False))]
    fits_up_to = {16: 2, 4: 4, 8: 8}
    limit = 100e9

    def used(modes, micro):
        return int(limit * (0.5 + 0.5 * micro / (fits_up_to[modes.lora_rank] + 0.5)))

    answers, runs, told = [], [], []
    for cpus in (1, 2):
        ev = _Traces(used, cpus)
        _side_by_side(ev, searched, spec, 8, limit, told.append)
        answers.append([best_micro_batch(ev, v, spec, 8, limit, whole).to_dict() for v, whole in searched])
        runs.append(ev)
    (one, two), (here, side) = answers, runs
    assert one == two
    assert [o["changes"].get("micro_batch_size", 8) for o in one] == [2, 4, 8]
    assert sorted(here.one_by_one) == sorted(t for r in side.rounds for t in r)  # the same trials, no more
    assert side.one_by_one == [] and here.rounds == []
    assert side.rounds == [[(4, 1), (8, 1), (16, 8)], [(4, 8), (8, 8), (16, 2)], [(4, 4), (16, 4)]]
    # the progress line says the traces run each time some come back (one CPU: nothing ran side by side)
    assert told == ["3 traces so far", "6 traces so far", "8 traces so far"]
    # a round that would leave a CPU idle: the whole-first bisection's likely next step beside its first
    # (as traced one by one it was asked next: micro-batch 2 fits, 4 is asked)
    alone = _Traces(used, 2)
    _side_by_side(alone, searched[:1], spec, 8, limit)
    assert alone.rounds == [[(16, 8)], [(16, 2), (16, 4)]]
    assert best_micro_batch(alone, *searched[0][:1], spec, 8, limit, True).to_dict() == one[0]
    assert alone.one_by_one == []


def test_a_trace_sent_back_from_a_fork_is_the_same_trace(tmp_path):
    """Forked traces come back pickled (MemoryTrace pickles its events column by column): every event and
    attribute survives, the rebuild's extras (attention calls, op costs) included."""
    import pickle

    ev = Evaluator(_deep_tiny(tmp_path), "ampere", (8, 0))
    trace = ev.rebuilt(None, 2, StepConfig("adamw", "bf16", False), TrainingModes(lora_rank=4))
    back = pickle.loads(pickle.dumps(trace))
    assert back == trace and back.events == trace.events and len(back.events) > 1000
    assert back.attention == trace.attention and back.op_costs == trace.op_costs




def test_asking_the_whole_batch_first_changes_the_traces_not_the_answer():
    """A full fine-tune whose state takes at most half the card is searched whole batch first, like adapters:
    the same option (the largest fitting micro-batch, the next larger one traced and not fitting) as micro-batch
    1 first; when the whole batch fits, one micro-batch is traced instead of two."""
    from dataclasses import replace as with_

    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit import _whole_first, best_micro_batch, state_floor, variants

    v = next(v for v in variants(lookup("rtx4090"), 1, "bf16", None, False) if v.name == "bf16")
    probe = Evaluator(TINY, "ada", (8, 9))
    used = {m: probe.evaluate(m, v.config, with_(v.modes, grad_accum=8 // m), v.split).device_used_bytes
            for m in (1, 2, 4, 8)}
    for fits_up_to, limit in ((8, used[8]), (2, (used[2] + used[4]) // 2)):
        spec = with_(lookup("rtx4090"), memory_bytes=int(limit / 0.95))
        assert _whole_first(v, state_floor(probe, v), limit) == (state_floor(probe, v) <= limit / 2)
        answers = []
        for whole in (False, True):
            ev = Evaluator(TINY, "ada", (8, 9))
            answers.append((best_micro_batch(ev, v, spec, 8, limit, whole_first=whole), ev.traces_run))
        (first_one, traced_one), (first_whole, traced_whole) = answers
        assert first_one.micro_batch_size == first_whole.micro_batch_size == fits_up_to
        assert first_one.device_used_bytes == first_whole.device_used_bytes == used[fits_up_to]
        if fits_up_to == 8:
            assert (traced_one, traced_whole) == (2, 1)


def test_an_option_lists_its_searchs_trials_the_answer_and_its_failing_neighbour_among_them():
    """`FitOption.trials`: the micro-batches the search asked, in order, with whether each fit and its bytes.
    The rule the answer keeps is read off them: the answer is traced and fits, the next larger divisor is traced
    and does not (micro-batch 1 first: 1, the whole batch, then the divisor the two predict)."""
    from dataclasses import replace as with_

    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit import best_micro_batch, variants

    v = next(v for v in variants(lookup("rtx4090"), 1, "bf16", None, False) if v.name == "bf16")
    probe = Evaluator(TINY, "ada", (8, 9))
    used = {m: probe.evaluate(m, v.config, with_(v.modes, grad_accum=8 // m), v.split).device_used_bytes
            for m in (1, 2, 4, 8)}
    assert used[1] < used[2] < used[4] < used[8]
    limit = (used[2] + used[4]) // 2  # micro-batch 2 fits, 4 does not
    spec = with_(lookup("rtx4090"), memory_bytes=int(limit / 0.95))
    for whole_first in (False, True):
        option = best_micro_batch(Evaluator(TINY, "ada", (8, 9)), v, spec, 8, limit, whole_first=whole_first)
        assert option.micro_batch_size == 2 and option.fits
        assert (2, True, used[2]) in option.trials and (4, False, used[4]) in option.trials
        assert all(b == used[m] and fits == (b <= limit) for m, fits, b in option.trials)
        assert option.trials[0] == ((8, False, used[8]) if whole_first else (1, True, used[1]))
        assert len({m for m, _, _ in option.trials}) == len(option.trials)  # each asked once


def test_the_whole_batch_is_asked_when_micro_batch_1_does_not_fit():
    """Memory is not monotone where accumulation starts: accumulated micro-batches keep the earlier ones'
    gradients through each later forward, the whole batch never does (Llama-2-7B bf16 + checkpointing on an
    H200: 144.0 GB at 1 x 8, 138.1 GB at 8 x 1). When micro-batch 1 does not fit, the whole batch is asked."""
    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit import best_micro_batch, variants

    v = next(v for v in variants(lookup("h200"), 1, "bf16", None, False) if v.name == "bf16")
    gb = 10**9
    used = {1: 144 * gb, 2: 145 * gb, 4: 147 * gb, 8: 138 * gb}
    option = best_micro_batch(_Traces(lambda modes, m: used[m], 1), v, lookup("h200"), 8, 143 * gb)
    assert option.fits and option.micro_batch_size == 8 and option.grad_accum == 1
    assert option.trials == [(1, False, used[1]), (8, True, used[8])]
    # and where the whole batch does not fit either, the answer stays micro-batch 1, not fitting
    used[8] = 150 * gb
    option = best_micro_batch(_Traces(lambda modes, m: used[m], 1), v, lookup("h200"), 8, 143 * gb)
    assert not option.fits and option.micro_batch_size == 1 and option.trials[-1] == (8, False, used[8])


def test_the_load_of_processes_that_have_ended_is_not_others_work(monkeypatch):
    """The 1-minute load average lags behind a process that has ended: a fit run right after another one read it as
    another process's work and traced on one CPU of an idle two (12.3 s against 8.8 s). The CPUs fit forks on
    count the others runnable now where they are fewer; where one is busy now, it still counts."""
    import os

    from gpuwise.plan import forks

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 1.0, 0.5))  # the last fit, ended a moment ago
    monkeypatch.setattr(forks, "_own_load", lambda: 0.0)
    monkeypatch.setattr(forks, "_others_running", lambda: 0)
    assert forks.idle_cpus() == 2
    monkeypatch.setattr(forks, "_others_running", lambda: 2)  # two others busy now: the lagging average is lower
    assert forks.idle_cpus() == 1
    monkeypatch.setattr(forks, "_others_running", lambda: None)  # no /proc: the load average alone
    assert forks.idle_cpus() == 1


def test_the_fsdp_options_code_names_the_models_own_blocks(tmp_path):
    """The FSDP option's code said `for block in model.model.layers` whatever the model: a T5's blocks are its two
    stacks (plan/memory/fsdp_units.py `block_lists`, as `gpuwise train` shards them)."""
    from gpuwise.plan import fit as fitting
    from gpuwise.plan.catalog import lookup
    from gpuwise.plan.fit_options import changes_of, variants

    t5 = tmp_path / "t5.json"
    t5.write_text(json.dumps({"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 256, "num_layers": 4,
                              "num_heads": 4, "vocab_size": 512, "is_encoder_decoder": True}))
    codes = {}
    for name, source in (("t5", str(t5)), ("llama", "tests/data/configs/tiny-llama.json")):
        ev = Evaluator(hf_workload(source, seq_len=16), "ampere")
        v = next(v for v in variants(lookup("a10g"), 2, "bf16", None, False) if v.split.strategy == "fsdp")
        codes[name] = [c for c in changes_of(v, 1, 1, 2, fitting._blocks(ev, v))["code"] if "fully_shard" in c]
    assert codes["t5"] == ["for block in [*model.decoder.block, *model.encoder.block]: fully_shard(block); "
                           "fully_shard(model)  # FSDP2"]
    assert codes["llama"] == ["for block in model.model.layers: fully_shard(block); fully_shard(model)  # FSDP2"]
