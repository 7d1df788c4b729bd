"""What makes `fit` fast without changing its answers (issue 20): deferred torch.compile while the optional
libraries load. No timing here: each test checks a mechanism."""

import sys
import types

from gpuwise import optional_libs


def test_a_deferred_compile_compiles_on_first_call_with_the_same_arguments():
    calls = []

    def real(model=None, **kwargs):
        calls.append((model, kwargs))
        return lambda *a, **k: ("compiled", model(*a, **k))

    deferred = optional_libs._deferred_compile(real)

    def f(x):
        return x + 1

    g = deferred(f, dynamic=False)
    assert calls == [] and g.__name__ == "f"           # nothing compiled (nor imported) yet
    assert g(1) == ("compiled", 2) and g(2) == ("compiled", 3)
    assert calls == [(f, {"dynamic": False})]            # once, with the arguments it was given
    h = deferred(mode="max-autotune")(f)                 # @torch.compile(...) as a decorator
    assert h(0) == ("compiled", 1) and calls[-1] == (f, {"mode": "max-autotune"})
    module = types.SimpleNamespace()                     # not a plain function: compiled at once, as before
    deferred(module)
    assert calls[-1] == (module, {})


def test_an_optional_library_is_imported_with_compile_deferred_and_torch_compile_restored(monkeypatch, tmp_path):
    import torch

    (tmp_path / "compiles_at_import.py").write_text(
        "import torch\nSEEN = torch.compile\n@torch.compile(dynamic=False)\ndef kernel(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = torch.compile
    mod = optional_libs.imported("compiles_at_import")
    try:
        assert torch.compile is real and mod.SEEN is not real   # deferred only while it loads
        assert mod.kernel.__name__ == "kernel" and not hasattr(mod.kernel, "_torchdynamo_orig_callable")
        assert optional_libs.imported("compiles_at_import") is mod  # imported once
    finally:
        sys.modules.pop("compiles_at_import", None)


def _deep_tiny(tmp_path, layers: int = 6) -> str:
    import json

    path = tmp_path / f"tiny{layers}.json"
    path.write_text(json.dumps({**json.load(open("tests/data/configs/tiny-llama.json")), "num_hidden_layers": layers}))
    return str(path)


def test_a_forks_replays_come_back_with_its_trace_and_are_the_parents(tmp_path, monkeypatch):
    """prefetch's forks replay the asks they trace (Evaluator._replays_of): the parent then replays none of
    them, and each ask's numbers (offload and accumulation variants of one trace included) are those of an
    evaluator that traced and replayed everything itself."""
    from dataclasses import asdict

    from gpuwise.plan.memory.split import Split
    from gpuwise.plan.scaled import Evaluator
    from gpuwise.plan.tracing.modes import TrainingModes
    from gpuwise.step import StepConfig

    source = _deep_tiny(tmp_path)
    config = StepConfig("adamw", "bf16", False)
    asks = [(1, config, TrainingModes(grad_accum=4), Split()), (2, config, TrainingModes(), Split()),
            (2, config, TrainingModes(offload_optimizer=True), Split())]
    forked, here = Evaluator(source, "ada", (8, 9)), Evaluator(source, "ada", (8, 9))
    forked.prefetch(asks, workers=2)  # two steps (offload is a transform of micro-batch 2's), one fork each
    assert forked.traces_run == 4

    def replayed_here(*_a, **_k):
        raise AssertionError("replayed in the parent")

    monkeypatch.setattr(forked, "_replayed", replayed_here)
    for ask in asks:
        got, own = forked.evaluate(*ask), here.evaluate(*ask)
        assert {k: v for k, v in asdict(got).items() if k != "op_costs"} == \
            {k: v for k, v in asdict(own).items() if k != "op_costs"}
        assert got.op_costs == own.op_costs


def test_every_gpus_searches_side_by_side_give_each_gpu_its_own_fit(tmp_path, monkeypatch):
    """`--gpu all` runs every GPU's searches side by side (fit_gpus._side_by_side_gpus), each asking its traces
    under its own attention kernels: each GPU's options are those of a fit of that GPU alone; GPUs whose
    attention kernels differ (a V100, sm70: no flash; an A100, sm80) do not share a trace of the same step, and
    no step is handed to the workers for two attention classes at once (the second asks once the first is back,
    where it may share); the steps asked whole (a rebuild that failed) are traced in forks too, and no trace runs
    more than once."""
    from gpuwise.plan import fit as fitting
    from gpuwise.plan import fit_gpus, forks
    from gpuwise.plan import side_by_side as fit_searches
    from gpuwise.plan.catalog import CATALOG
    from gpuwise.plan.scaled import Evaluator
    from gpuwise.plan.tracing.sdpa import kernel_class

    monkeypatch.setattr(fit_searches, "idle_cpus", lambda: 2)
    # Adafactor's step is the one here whose rebuild fails, asked whole: not swapped into AdamW's step
    # (tests/test_plan_optimizer_swap.py), as where the swap's check fails
    monkeypatch.setattr(Evaluator, "_base", lambda self, *a: None)
    two = {k: CATALOG[k] for k in ("a100-40gb", "v100-16gb")}
    monkeypatch.setattr(fit_gpus, "CATALOG", two)
    source = _deep_tiny(tmp_path)
    rounds: list[list[tuple]] = []
    kept: list[Evaluator] = []
    submit = forks.Forks.submit

    def recorded(self, asks, spare=False):
        kept.append(self.ev)
        assert not any(self.flying(a) for a in asks)  # not in flight, under this or another attention class
        if not spare:
            rounds.append([((a[0], tuple(sorted(vars(a[1]).items())), a[2], a[3], a[4]), kernel_class(a[5]))
                           for a in asks])
        return submit(self, asks, spare)

    monkeypatch.setattr(forks.Forks, "submit", recorded)
    together = fit_gpus.fit_all_gpus(source, 1, 4, seq_len=16, precision="bf16")
    monkeypatch.setattr(forks.Forks, "submit", submit)
    assert len([r for r in rounds if r]) >= 2
    for r in rounds:  # one attention class per step in a submission
        classes: dict[tuple, set] = {}
        for step, c in r:
            classes.setdefault(step, set()).add(c)
        assert all(len(c) == 1 for c in classes.values())
    assert any(step[4] for r in rounds for step, _ in r)  # a step asked whole, traced in a fork
    ev = kept[0]
    volta, ampere = kernel_class((7, 0)), kernel_class((8, 0))
    assert volta != ampere
    by_step: dict[tuple, set] = {}
    for key, trace in ev._traces.items():
        by_step.setdefault(key[:-1], set()).add((key[-1], id(trace)))
    both = [s for s, got in by_step.items() if {c for c, _ in got} >= {volta, ampere}]
    assert both and all(len({t for _, t in by_step[s]}) == 2 for s in both)  # two classes, two traces
    for result, spec in zip(together, two.values()):
        alone = fitting.fit(source, spec, 1, 4, seq_len=16, precision="bf16")
        assert result.to_dict() == alone.to_dict(), spec.name
