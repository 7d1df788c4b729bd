"""A step whose caching allocator, given room, would reserve more than the card offers: PyTorch's allocator
frees its cache and retries the failed cudaMalloc (`release_cached_blocks`), and the step runs. estimate and
fit replay it under the card's limit (plan/memory/cuda.py): it fits, at the capped bytes, with its retries
counted; only a step that is out of memory even then does not fit."""

import json
import shlex

from gpuwise.cli import main
from gpuwise.contracts import SCHEMA_VERSION, validate
from gpuwise.plan.estimate import estimate
from gpuwise.plan.fit import NO_SPEED, fit
from gpuwise.plan.memory.cuda import RETRIES_NOTE, cuda_memory
from gpuwise.plan.memory.events import MemEvent, MemoryTrace

MIB = 1024**2


def _fragmenting_step() -> MemoryTrace:
    """Each step: 30 MiB made and freed (cached), then 40 MiB, which the cached 30 MiB block cannot serve."""
    events = []
    for step in range(2):
        base = 10 * step
        events += [MemEvent("alloc", base, 30 * MIB, "activations", "forward"),
                   MemEvent("free", base, 30 * MIB, "activations", "forward"),
                   MemEvent("alloc", base + 1, 40 * MIB, "activations", "backward"),
                   MemEvent("free", base + 1, 40 * MIB, "activations", "backward")]
    return MemoryTrace(events, 4, "cuda")


def test_a_step_over_the_limit_only_by_its_cache_runs_with_retries():
    t = _fragmenting_step()
    roomy = cuda_memory(t, "hopper")
    assert roomy.free is None and roomy.result.retries == 0
    assert cuda_memory(t, "hopper", limit_bytes=roomy.device_used_bytes).free is None  # at the limit: no cap
    # 30 MiB under: the 40 MiB request fails once, the cached 30 MiB segment is freed, and it is served
    capped = cuda_memory(t, "hopper", limit_bytes=roomy.device_used_bytes - 20 * MIB)
    assert capped.free is not None and capped.free.max_reserved_bytes == roomy.result.max_reserved_bytes
    assert capped.device_used_bytes == roomy.device_used_bytes - 30 * MIB
    assert capped.result.retries == 1 and capped.result.steady_retries == 0  # then 40 MiB stays cached for both
    assert capped.result.peak_allocated_bytes == roomy.result.peak_allocated_bytes
    # under the step's own 40 MiB (plus what lives beside it): out of memory even after freeing the cache
    short = cuda_memory(t, "hopper", limit_bytes=roomy.device_used_bytes - 40 * MIB)
    assert short.free is None and short.device_used_bytes == roomy.device_used_bytes


def _band(wl: str, b: int) -> tuple[int, int, int]:
    """(device bytes with room, the bytes of a GPU between the step's allocated and reserved bytes, of one
    under its allocated bytes) for `wl` at batch `b`, bf16."""
    e = estimate(wl, b, precision="bf16", gpu="80GiB", margin_pct=0, search_max_batch=False)
    a = e.allocator
    outside = e.device_used_bytes - a.max_reserved_bytes
    assert a.max_reserved_bytes > a.max_allocated_bytes + 256 * MIB  # the step caches free blocks
    return (e.device_used_bytes, a.max_allocated_bytes + outside + 3 * (a.max_reserved_bytes - a.max_allocated_bytes) // 4,
            a.max_allocated_bytes + outside - 64 * MIB)


def test_estimate_and_fit_answer_a_card_the_step_fits_only_by_retrying(capsys):
    wl, b = "examples:gpt-mini", 64
    roomy, band, under = _band(wl, b)
    gpu = f"{band / MIB:.3f}MiB"
    e = estimate(wl, b, precision="bf16", gpu=gpu, margin_pct=0)
    assert e.fits and e.device_used_bytes <= e.gpu_memory_bytes < roomy
    d = e.to_dict()["allocator"]
    assert d["retries"] >= 1 and d["reserved_with_room_bytes"] > d["max_reserved_bytes"]
    assert any(n.startswith("allocator: with room the step would hold") for n in e.notes)
    assert e.max_batch_size >= b  # the largest-batch search asks the same question of every batch
    no = estimate(wl, b, precision="bf16", gpu=f"{under / MIB:.3f}MiB", margin_pct=0, search_max_batch=False)
    assert not no.fits and no.device_used_bytes == roomy
    # fit, on the same card: the job as given fits at those bytes, which its estimate_cmd prints; a GPU known
    # by its memory alone has no speed to rank by (cannot tell: samples/s 0, said first)
    r = fit(wl, gpu, 1, b, precision="bf16", margin_pct=0)
    given = next(o for o in r.options if o.name == "as given")
    assert given.fits and given.device_used_bytes == e.device_used_bytes
    assert given.samples_per_s == 0 and given.notes[0] == NO_SPEED
    assert any(n.startswith("allocator: with room") for n in given.notes)
    assert main(shlex.split(given.estimate_cmd)[1:] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    validate("estimate", out)  # the allocator's new keys are typed in the schema
    assert out["device_used_bytes"] == given.device_used_bytes and out["allocator"]["retries"] >= 1
    # the table says so too (fit crashed on such a GPU: the roofline divided by its zero bandwidth)
    from gpuwise.report import console
    from gpuwise.report.fit import render_fit

    with console.out.capture() as shown:
        render_fit(r)
    assert "samples/s: cannot tell" in shown.get()
    assert "* fits only as PyTorch's allocator runs a full card" in shown.get()


def test_the_model_is_built_on_the_host_then_arrives_on_the_device(tmp_path):
    """docs/contracts.md: `model()` is built on the CPU and gpuwise moves it (its runner casts a bf16-pure model
    there first). The trace follows the construction; the device sees only what arrives: a bf16-pure model's
    fp32 weights, which the cast replaces, never reach it."""
    from gpuwise.plan.memory.events import built_on_the_host

    setup = [MemEvent("alloc", 0, 400 * MIB, "temporary", "setup"),       # an fp32 weight, as built
             MemEvent("alloc", 1, 200 * MIB, "parameters", "setup"),      # its bf16 copy
             MemEvent("free", 0, 400 * MIB, "temporary", "setup"),
             MemEvent("alloc", 2, 1 * MIB, "buffers", "setup")]
    step = [MemEvent("alloc", 3, 2 * MIB, "inputs", "setup"), MemEvent("alloc", 4, 50 * MIB, "activations", "forward"),
            MemEvent("free", 4, 50 * MIB, "activations", "backward")]
    t = MemoryTrace(setup + step, 5, "cuda")
    host = built_on_the_host(t)
    assert [e.block for e in host.events] == [1, 2, 3, 4, 4] and host.steady_start == 3
    assert host.events[host.steady_start:] == t.events[t.steady_start:]
    # 200 MiB + a small 2 MiB segment (1 MiB) + a 20 MiB one (2 MiB) + 50 MiB: the 400 MiB never arrives
    assert cuda_memory(t, "hopper").result.max_reserved_bytes == (200 + 2 + 20 + 50) * MIB
    assert built_on_the_host(host) is host  # nothing left to drop

    job = tmp_path / "job.py"
    job.write_text("import torch\n"
                   "def model():\n    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])\n"
                   "def batch(n):\n    return torch.randn(n, 2048), torch.randint(0, 2048, (n,))\n"
                   "def loss(model, batch):\n    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])\n")
    e = estimate(str(job), 4, precision="bf16-pure", optimizer="sgd", gpu="80GiB", search_max_batch=False)
    bf16_params = 4 * (2048 * 2048 + 2048) * 2

    def setup_allocs(trace):
        end = next(i for i, ev in enumerate(trace.events) if ev.phase != "setup" or ev.category == "inputs")
        return sum(ev.nbytes for ev in trace.events[:end] if ev.action == "alloc")

    # the trace builds the fp32 weights (2 x bf16_params) and casts them; the device sees the bf16 ones arrive
    # (and the batch's fp32 copy, which the runner moves before casting it)
    assert setup_allocs(e.trace) >= 3 * bf16_params
    assert setup_allocs(built_on_the_host(e.trace)) == bf16_params + 4 * 2048 * 4


def test_run_lengths_replays_the_run_under_the_card_as_it_replays_a_step(tmp_path):
    """--seq-len-dist: the first micro-step at the longest sample and the later ones replayed together are each
    replayed under the card's limit too: a run that holds more than the card only by its cache fits, by retries,
    and says which replay retried; one whose requests alone are over the card does not fit."""
    import random

    rng = random.Random(0)
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("".join(f"{rng.randint(16, 200)}\n" for _ in range(3000)) + "512 1\n")

    def run(gpu: str):
        return estimate("tests/data/configs/wide-vocab-llama.json", 8, precision="bf16", gpu=gpu, margin_pct=0,
                        search_max_batch=False, seq_len_dist=str(lengths), micro_steps=4)

    roomy = run("80GiB")
    assert roomy.lengths["later_seq_len"] < 512 and not any(n.startswith(RETRIES_NOTE) for n in roomy.notes)
    joined = run(f"{(roomy.device_used_bytes - 8 * MIB) / MIB:.3f}MiB")  # the later steps after the first: retry
    assert joined.fits and joined.device_used_bytes <= joined.gpu_memory_bytes < roomy.device_used_bytes
    assert any(n.startswith("run lengths, the first micro-step and the later ones replayed together: "
                            f"{RETRIES_NOTE} the step would hold") for n in joined.notes)
    first = run(f"{(roomy.device_used_bytes - 64 * MIB) / MIB:.3f}MiB")  # the first micro-step alone retries too
    assert first.fits and first.device_used_bytes <= first.gpu_memory_bytes
    assert any(n.startswith(f"{RETRIES_NOTE} the first micro-step would hold") for n in first.notes)
    short = run(f"{(roomy.lengths['first_peak_allocated_bytes'] - 64 * MIB) / MIB:.3f}MiB")
    assert not short.fits and short.device_used_bytes == roomy.device_used_bytes


def test_an_option_that_could_not_be_traced_says_cannot_tell():
    """An option the tracer cannot run for this model (QLoRA where its trace failed, say) is not sized: the table
    shows '?' and '-' and its reason, not 'no' at 0 B as if it did not fit, and --json says sized: false."""
    from gpuwise.plan.fit import FitOption, FitResult
    from gpuwise.report import console
    from gpuwise.report.fit import render_fit

    why = "not sized: cannot tell: fake tensors could not run the step"
    changes = {"precision": "bf16", "checkpointing": False, "optimizer": "adamw", "micro_batch_size": 8,
               "grad_accum": 1, "nproc": 1, "strategy": "single", "code": []}
    unsized = FitOption("QLoRA r16 (bf16)", changes, False, 0, 0.0, 8, [why, "same math; one extra forward"],
                        sized=False)
    sized = FitOption("bf16", changes, True, 5 * 2**30, 12.5, 8, ["bf16 autocast"])
    r = FitResult("w", "NVIDIA A10", 1, 24 * 2**30, 8, [sized, unsized])
    with console.out.capture() as shown:
        render_fit(r)
    row = next(line for line in shown.get().splitlines() if "QLoRA" in line)
    assert "?" in row and "not sized: cannot tell" in row and "0 B" not in row and " no " not in row
    assert "? cannot tell: not sized" in shown.get()
    d = r.to_dict()
    assert d["options"][1]["sized"] is False and "sized" not in d["options"][0]
    validate("fit", {"schema_version": SCHEMA_VERSION, **d})
