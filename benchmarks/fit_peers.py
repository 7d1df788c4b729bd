"""Will it fit? gpuwise vs the estimators people use, on 1B / 7B / 13B / 70B decoders.

    python benchmarks/fit_peers.py             # all rows (a few minutes on 2 cores), writes
                                               # benchmarks/results/fit_peers.{json,md}
    python benchmarks/fit_peers.py --quick     # 1B and 7B only

Setting: one training step, batch 1 x 2048 tokens, bf16 autocast, AdamW, activation checkpointing;
full fine-tune, LoRA (r=16, all linear layers, base in bf16) and QLoRA (NF4 base + LoRA); on 1 GPU and
on 8 GPUs (full: FSDP2 full shard = ZeRO-3; LoRA / QLoRA: DDP). Per GPU, in GiB.

- gpuwise      `plan/scaled.py`: the real step (transformers, peft, bitsandbytes) traced with fake tensors at
               1 and 2 layers, extrapolated to the depth; caching-allocator replay + CUDA context (H100);
               sharding as a transform of the traced events (plan/memory/sharding.py).
- accelerate   `accelerate estimate-memory`'s "Training using Adam" figure: max of
               `estimate_training_usage(model bytes, "bfloat16")` (accelerate/commands/estimate.py) = 2 x
               fp32 model bytes, whatever the batch, sequence, LoRA or GPU count (it models none of them).
- DeepSpeed    `estimate_zero3_model_states_mem_needs(..., cpu_offload=False)` for 8 GPUs:
               4 x largest layer + 18 x params / GPUs; `estimate_zero2_model_states_mem_needs(...,
               cpu_offload=False)` for 1 GPU: 4 x params + 16 x params / GPUs
               (deepspeed/runtime/zero/stage3.py and stage_1_and_2.py). Model states only, full fine-tune only.
- formula      the calculator formula of EleutherAI's "Transformer Math 101" (2023): bf16 weights 2 bytes,
               AdamW mixed precision 12 bytes, gradients 2 bytes per trained parameter; activations with
               full recomputation 2*s*b*h bytes per layer plus one layer's sbh(34 + 5as/h)
               (Korthikanti et al. 2022, eq. 2); LoRA: 2 bytes per frozen weight, QLoRA 0.5; model states
               / GPUs on 8 for full (ZeRO-3), replicated for LoRA / QLoRA (DDP).

Public measurements to hold these against are scarce and rarely give batch and sequence; the one used
here: QLoRA (Dettmers et al. 2023, abstract) "finetune a 65B parameter model on a single 48GB GPU".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpuwise.hf import approx_params, hf_workload, load_config, num_layers_of  # noqa: E402
from gpuwise.plan.memory.split import Split  # noqa: E402
from gpuwise.plan.scaled import Evaluator  # noqa: E402
from gpuwise.plan.tracing.modes import TrainingModes  # noqa: E402
from gpuwise.step import StepConfig  # noqa: E402

GIB = 2**30
MODELS = {"1B": "examples/configs/llama-3.2-1b.json", "7B": "examples/configs/llama-2-7b.json",
          "13B": "examples/configs/llama-2-13b.json", "70B": "examples/configs/llama-2-70b.json"}
MODES = {"full": TrainingModes(), "LoRA": TrainingModes(lora_rank=16),
         "QLoRA": TrainingModes(lora_rank=16, qlora=True)}
SEQ, BATCH, NGPU = 2048, 1, 8


def peer_accelerate(params: int) -> float:
    from accelerate.commands.estimate import estimate_training_usage

    return max(estimate_training_usage(4 * params, "bfloat16").values()) / GIB


def peer_deepspeed(params: int, largest_layer: int, gpus: int) -> float:
    if gpus == 1:  # estimate_zero2_model_states_mem_needs(cpu_offload=False)
        return (4 * params + int(16 * params / gpus)) / GIB
    return (4 * largest_layer + int(18 * params / gpus)) / GIB  # zero3, cpu_offload=False


def peer_formula(cfg, params: int, mode: str, gpus: int) -> float:
    h = cfg.hidden_size
    a = cfg.num_attention_heads
    layers = num_layers_of(cfg)
    s, b = SEQ, BATCH
    lora_params = 0
    if mode == "full":
        states = 16 * params
    else:
        inter = cfg.intermediate_size
        kv = (getattr(cfg, "num_key_value_heads", a) or a) * (h // a)
        shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]  # q k v o gate up down
        lora_params = layers * 16 * sum(i + o for i, o in shapes)  # r x (in + out) per adapted linear
        states = (2 if mode == "LoRA" else 0.5) * params + 16 * lora_params
    activations = 2 * s * b * h * layers + s * b * h * (34 + 5 * a * s / h)
    shards = gpus if mode == "full" else 1  # full: ZeRO-3 over the GPUs; LoRA / QLoRA: DDP replicas
    return (states / shards + activations) / GIB


def largest_layer_params(cfg) -> int:
    return max(cfg.vocab_size * cfg.hidden_size, cfg.hidden_size * cfg.intermediate_size)


def gpuwise_row(ev: Evaluator, mode: str, gpus: int) -> tuple[float, float]:
    split = Split() if gpus == 1 else Split("fsdp" if mode == "full" else "ddp", gpus)
    t = time.perf_counter()
    point = ev.evaluate(BATCH, StepConfig("adamw", "bf16", True), MODES[mode], split)
    return point.device_used_bytes / GIB, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    models = {k: v for k, v in MODELS.items() if not args.quick or k in ("1B", "7B")}
    rows = []
    for name, path in models.items():
        cfg = load_config(str(ROOT / path))
        params = approx_params(cfg)
        ev = Evaluator(hf_workload(str(ROOT / path), SEQ), "hopper")
        for mode in MODES:
            for gpus in (1, NGPU):
                used, seconds = gpuwise_row(ev, mode, gpus)
                row = {"model": name, "params": params, "mode": mode, "gpus": gpus,
                       "gpuwise_gib": round(used, 2), "gpuwise_s": round(seconds, 2),
                       "accelerate_gib": round(peer_accelerate(params), 2),
                       "deepspeed_gib": round(peer_deepspeed(params, largest_layer_params(cfg), gpus), 2)
                       if mode == "full" else None,
                       "formula_gib": round(peer_formula(cfg, params, mode, gpus), 2)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "fit_peers.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| model | mode | GPUs | gpuwise | accelerate | DeepSpeed | formula | gpuwise s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ds = f"{r['deepspeed_gib']:.1f}" if r["deepspeed_gib"] is not None else "n/a"
        lines.append(f"| {r['model']} | {r['mode']} | {r['gpus']} | {r['gpuwise_gib']:.1f} | {r['accelerate_gib']:.1f} "
                     f"| {ds} | {r['formula_gib']:.1f} | {r['gpuwise_s']:.1f} |")
    (out / "fit_peers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
