"""gpuwise's memory estimate vs the tools people use today, against the CPU profiler's truth.

    python benchmarks/plan_peers.py            # all workloads (several minutes on 2 cores)
    python benchmarks/plan_peers.py --quick    # gpt-mini and GPT-2 small only

For each workload (random weights, no downloads) one steady-state AdamW fp32 training step is measured on
the CPU with PyTorch's profiler memory timeline (`gpuwise.plan.tracing.cpu_truth`, exact to the byte), then
predicted by:

- gpuwise       `gpuwise.estimate(..., target="cpu")` (fake-tensor trace of the same step);
- accelerate    `accelerate estimate-memory`'s training figure: `estimate_training_usage(model bytes, "float32")`
                (accelerate/commands/estimate.py), the max of its parts = 4 x model bytes, any batch;
- torchinfo     `summary(model, input_data=batch, mode="train").total_*`: params + inputs + forward outputs;
- DeepSpeed     the model-state formula of ZeRO (Rajbhandari et al. 2020, sec. 3.1; DeepSpeed's
                `estimate_zero*_model_states_mem_needs`): K bytes per parameter, K = 4 (weights) + 4
                (gradients) + 4 x (fp32 optimizer states: Adam 2, momentum 1, SGD 0); mixed precision
                Adam: 2 + 2 + 12 = 16. No activations;
- MemTracker    `torch.distributed._tools.mem_tracker.MemTracker` over the same step under FakeTensorMode.

Prints error vs truth (signed, %) and seconds per tool, and the GPT-2-small timing of gpuwise vs MemTracker
in the same process (goal: gpuwise <= 0.5x MemTracker). Full results: benchmarks/results/plan_peers.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from gpuwise.plan import estimate  # noqa: E402
from gpuwise.plan.tracing.cpu_truth import measure_cpu_peak  # noqa: E402
from gpuwise.step import make_optimizer  # noqa: E402
from gpuwise.workload import Workload, load_workload  # noqa: E402


# -- workloads: transformers architectures from their configs (random weights) + bundled examples --------
def _tokens(b: int, seq: int, vocab: int) -> dict:
    ids = torch.randint(0, vocab, (b, seq), generator=torch.Generator().manual_seed(b))
    return {"input_ids": ids, "labels": ids.clone()}


def _images(b: int, size: int = 224, classes: int = 10) -> dict:
    g = torch.Generator().manual_seed(b)
    return {"pixel_values": torch.rand(b, 3, size, size, generator=g), "labels": torch.randint(0, classes, (b,), generator=g)}


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config())                      # GPT-2 small, 124M


def _bert():
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig())                      # BERT-base, 110M


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, pad_token_id=0))  # T5-small, 60M


def _vit():
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(num_labels=10))  # ViT-B/16, 86M


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    return ResNetForImageClassification(ResNetConfig(num_labels=10))  # ResNet-50 layout, 24M


WORKLOADS = {
    "gpt-mini (bundled)": ("examples:gpt-mini", 8),
    "GPT-2 small b4 s256": (Workload("hf:gpt2-small", _gpt2, lambda b: _tokens(b, 256, 50257)), 4),
    "BERT-base b4 s128": (Workload("hf:bert-base", _bert, lambda b: _tokens(b, 128, 30522)), 4),
    "T5-small b4 s128": (Workload("hf:t5-small", _t5, lambda b: _tokens(b, 128, 32128)), 4),
    "ViT-B/16 b4 224px": (Workload("hf:vit-base", _vit, _images), 4),
    "ResNet-50 b4 224px": (Workload("hf:resnet-50", _resnet, _images), 4),
}
QUICK = ("gpt-mini (bundled)", "GPT-2 small b4 s256")


# -- the peers ---------------------------------------------------------------------------------------------
def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def peer_accelerate(wl: Workload, b: int) -> int:
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _largest = calculate_maximum_sizes(wl.build_model())
    return int(max(estimate_training_usage(total, "float32").values()))


def peer_torchinfo(wl: Workload, b: int) -> int:
    from torchinfo import summary

    batch = wl.build_batch(b)
    if isinstance(batch, (tuple, list)):  # (inputs, targets): torchinfo calls model(inputs)
        batch = [batch[0]]
    stats = summary(wl.build_model(), input_data=batch, mode="train",
                    verbose=0, device="cpu")
    return int(stats.total_input + stats.total_output_bytes + stats.total_param_bytes)


DEEPSPEED_STATE_BYTES = {"adamw": 8, "adam": 8, "momentum": 4, "sgd": 0}  # fp32 optimizer states per parameter


def peer_deepspeed(wl: Workload, b: int, optimizer: str = "adamw") -> int:
    n = sum(p.numel() for p in wl.build_model().parameters())
    return n * (4 + 4 + DEEPSPEED_STATE_BYTES[optimizer])  # fp32: weights + gradients + states (ZeRO sec. 3.1)


def peer_memtracker(wl: Workload, b: int) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():  # the step gpuwise runs, written out: Module.to() cannot swap fake parameters
        model = wl.build_model()
        optimizer = make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad])
        batch = wl.build_batch(b)
        mt = MemTracker()
        mt.track_external(model, optimizer)
        with mt:
            for i in range(2):  # warm-up (creates optimizer state), then the steady step
                wl.compute_loss(model, batch).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if i == 0:
                    mt.reset_mod_stats()  # as torch's MemTracker example does between iterations
        return int(mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def peer_gpuwise(wl: Workload, b: int) -> int:
    return estimate(wl, b, target="cpu").peak_allocated_bytes


PEERS = {"gpuwise": peer_gpuwise, "accelerate": peer_accelerate, "torchinfo": peer_torchinfo,
         "DeepSpeed formula": peer_deepspeed, "MemTracker": peer_memtracker}


def timed(fn, *args):
    t = time.perf_counter()
    try:
        value, error = fn(*args), None
    except Exception as exc:  # a peer that cannot handle a model is a result, not a crash of the benchmark
        value, error = None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:80]}"
    return value, error, time.perf_counter() - t


def gpt2_timing(repeats: int) -> dict:
    wl, b = WORKLOADS["GPT-2 small b4 s256"]
    times: dict[str, list[float]] = {"gpuwise": [], "gpuwise (cuda target)": [], "MemTracker": []}
    for _ in range(repeats):
        for name, fn in (("gpuwise", lambda: estimate(wl, b, target="cpu")),
                         ("gpuwise (cuda target)", lambda: estimate(wl, b, target="cuda")),
                         ("MemTracker", lambda: peer_memtracker(wl, b))):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"runs_s": times, "median_s": med, "ratio_gpuwise_to_memtracker": med["gpuwise"] / med["MemTracker"],
            "ratio_gpuwise_cuda_to_memtracker": med["gpuwise (cuda target)"] / med["MemTracker"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="gpt-mini and GPT-2 small only")
    ap.add_argument("--repeats", type=int, default=3, help="GPT-2 timing repeats (default 3)")
    args = ap.parse_args()
    names = QUICK if args.quick else tuple(WORKLOADS)
    rows = []
    for name in names:
        spec, b = WORKLOADS[name]
        wl = load_workload(spec)
        truth, terr, tsec = timed(measure_cpu_peak, wl, b)
        row = {"workload": name, "batch_size": b, "truth_bytes": truth, "truth_error": terr, "truth_s": tsec}
        for peer, fn in PEERS.items():
            value, error, sec = timed(fn, wl, b)
            row[peer] = {"bytes": value, "error": error, "seconds": sec,
                         "err_pct": round(100 * (value - truth) / truth, 2) if value and truth else None}
        rows.append(row)
        print(f"  done {name}" + (f" (truth failed: {terr})" if terr else ""), file=sys.stderr)

    out = ROOT / "benchmarks" / "results" / "plan_peers.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "torch": torch.__version__}, indent=1))  # kept even if timing fails
    print("\nerror vs CPU profiler truth (signed %; x = the tool failed), AdamW fp32 step\n")
    print(f"{'workload':22} {'truth':>10} " + " ".join(f"{p:>18}" for p in PEERS))
    for r in rows:
        cells = []
        for p in PEERS:
            c = r[p]
            if c["error"]:
                text = "x " + c["error"][:15]
            else:
                text = "-" if c["err_pct"] is None else f"{c['err_pct']:+.2f}%"
            cells.append(f"{text:>18}")
        truth = f"{r['truth_bytes'] / 2**20:.0f} MiB" if r["truth_bytes"] else "x"
        print(f"{r['workload']:22} {truth:>10} " + " ".join(cells))
    print(f"\n{'median |err|':33}" + " ".join(
        f"{_median_abs([r[p]['err_pct'] for r in rows]):>18}" for p in PEERS))
    print(f"{'median seconds':33}" + " ".join(
        f"{statistics.median([r[p]['seconds'] for r in rows]):>17.2f}s" for p in PEERS))

    timing = gpt2_timing(args.repeats)
    print("\nGPT-2 small (124M, batch 4, 256 tokens), same process, median of", args.repeats)
    for k, v in timing["median_s"].items():
        print(f"  {k:24} {v:7.2f} s")
    print(f"  gpuwise / MemTracker = {timing['ratio_gpuwise_to_memtracker']:.2f}x (goal <= 0.5x); "
          f"cuda target / MemTracker = {timing['ratio_gpuwise_cuda_to_memtracker']:.2f}x")

    out.write_text(json.dumps({"rows": rows, "gpt2_timing": timing, "torch": torch.__version__}, indent=1))
    print(f"\nfull results: {out.relative_to(ROOT)}")
    return 0


def _median_abs(vals) -> str:
    vals = [abs(v) for v in vals if v is not None]
    return f"{statistics.median(vals):.2f}%" if vals else "-"


if __name__ == "__main__":
    sys.exit(main())
