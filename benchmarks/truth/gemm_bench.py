"""GEMM and attention kernels timed alone on a GPU, at the shapes of published model families, beside the speed
model's price of each (plan/speed/gemm.py, attention.py): the data the step-time model's constants are checked
against, one kernel at a time, where whole steps (truth_speed.py) and per-class profiles (profile_kernels.py)
cannot say which shape or backend is off.

    python benchmarks/truth/gemm_bench.py                    # on a GPU: ~1 minute, --budget-s caps it
    python benchmarks/truth/gemm_bench.py --device cpu --quick   # the plumbing on a CPU
    python benchmarks/truth/gemm_bench.py --compare FILE     # no GPU needed: measured vs the model, per row

GEMMs: a linear layer's three products (forward [T, d] x [d, f], input grad [T, f] x [f, d], weight grad
[d, T] x [T, f]) for hidden sizes d and feed-forward widths f of GPT-2, Llama 2/3, Mistral/Mixtral-class and
70B-class models, T tokens per step; LM heads with vocabularies that are and are not multiples of 64 (GPT-2's
50257 vs nanoGPT's padded 50304, 32000, 128256). bf16 and fp32 (TF32 off, as gpuwise's fp32 step runs).
Attention: torch SDPA forward and forward+backward, causal, per backend (flash, efficient, cudnn, math) where
it runs, bf16, plus fp32 with the default backend choice.

Each measurement is the median over repetitions timed with CUDA events after a warm-up, written as one JSON
line as soon as it is taken (atomically appended) to benchmarks/truth/kernels/<gpu>-ops.jsonl.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gpuwise.jsonl import append_line  # noqa: E402

# (hidden, feed-forward) of published configs: GPT-2 small/XL, Llama-3.2-1B, Llama-2-7B, Llama-3-8B,
# Llama-2-13B, Llama-3-70B (config.json hidden_size / intermediate_size on the Hugging Face Hub)
WIDTHS = [(768, 3072), (1600, 6400), (2048, 8192), (4096, 11008), (4096, 14336), (5120, 13824), (8192, 28672)]
TOKENS = [2048, 8192, 16384]
VOCABS = [50257, 50304, 32000, 128256]
# (batch, heads, seq, head_dim): GPT-2 small at 1024, Llama 7B/8B-class at 2048 and 8192, a 70B-class layer;
# then head_dim 64 and 128 at short and long sequences (BERT/ViT at 512, GPT-2 at 2048, hd128 at 1024)
ATTENTION = [(8, 12, 1024, 64), (4, 32, 2048, 128), (1, 32, 8192, 128), (2, 64, 4096, 128),
             (16, 12, 512, 64), (4, 12, 2048, 64), (1, 16, 8192, 64), (8, 32, 1024, 128), (32, 12, 256, 64)]
QUICK_GEMMS = [("linear_fwd", 64, 32, 48)]
QUICK_ATTENTION = [(1, 2, 16, 8)]


def gemm_shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of C[m, n] = A[m, k] B[k, n]."""
    if quick:
        return QUICK_GEMMS
    out = []
    for d, f in WIDTHS:
        for t in TOKENS:
            out += [("linear_fwd", t, f, d), ("linear_dgrad", t, d, f), ("linear_wgrad", d, f, t)]
    for v in VOCABS:
        for d in (768, 4096):
            out += [("lm_head_fwd", 8192, v, d), ("lm_head_dgrad", 8192, d, v), ("lm_head_wgrad", d, v, 8192)]
    return out


def _timed(fn, device, budget_s: float = 0.25, max_reps: int = 20, min_batch_s: float = 2e-3) -> float:
    """Median seconds of `fn()` over repetitions (CUDA events on a GPU, perf_counter on a CPU). On a GPU each
    repetition times a batch of back-to-back calls lasting >= `min_batch_s`, divided by its size: one call
    between two events with a sync would also time the host's launch when it is longer than the kernel
    (session 12's H200 rows read ~80-110 us forward / ~300-600 us forward+backward wherever the kernel was
    shorter than that)."""
    import torch

    for _ in range(3):
        fn()
    cuda = device.type == "cuda"
    calls = 1
    if cuda:  # calls per batch: enough back-to-back calls to outlast the host's launching of them
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        calls = max(1, min(64, int(min_batch_s / max(time.perf_counter() - t0, 1e-6)) + 1))
    times: list[float] = []
    start_all = time.perf_counter()
    while len(times) < max_reps and (len(times) < 3 or time.perf_counter() - start_all < budget_s):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_gemm(name: str, m: int, n: int, k: int, dtype: str, device) -> dict:
    import torch

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    a = torch.randn(m, k, device=device, dtype=dt)
    b = torch.randn(k, n, device=device, dtype=dt)
    s = _timed(lambda: torch.mm(a, b), device)
    return {"op": "gemm", "name": name, "m": m, "n": n, "k": k, "dtype": dtype, "measured_s": s,
            "tflops": 2 * m * n * k / s / 1e12}


def run_attention(shape: tuple[int, int, int, int], dtype: str, backend: str | None, device) -> dict:
    import torch
    import torch.nn.functional as F

    b, h, s, d = shape
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))
    if backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = lambda: sdpa_kernel([getattr(SDPBackend, "MATH" if backend == "math" else backend.upper() + "_ATTENTION")])  # noqa: E731
    else:
        import contextlib

        ctx = contextlib.nullcontext

    def fwd():
        with ctx():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        out = fwd()
        out.backward(torch.ones_like(out))

    row = {"op": "sdpa", "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True, "dtype": dtype,
           "backend": backend or "default"}
    row["forward_s"] = _timed(fwd, device)
    row["forward_backward_s"] = _timed(fwd_bwd, device)
    # causal attention FLOPs as torch.utils.flop_counter counts them (the full S x S products): 4 b h s^2 d forward
    row["forward_flops"] = 4 * b * h * s * s * d
    return row


def compare(path: Path, gpu_name: str | None) -> int:
    """Measured vs the speed model, per row of a measurement file (no GPU needed)."""
    from gpuwise.plan.catalog import lookup, speed_spec
    from gpuwise.plan.speed.attention import attention_s
    from gpuwise.plan.speed.gemm import ALIGN_BYTES, gemm_s

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    header = [r for r in rows if r.get("op") == "env"]
    gpu = lookup(gpu_name or (header[0]["gpu_name"] if header else ""))
    sp = speed_spec(gpu)
    bw = gpu.bandwidth_bytes_per_s * sp.memory_efficiency
    errs = []
    print(f"{gpu.name}: measured vs plan/speed model (signed error of the model's time)")
    for r in rows:
        if r.get("op") == "gemm":
            item = 2 if r["dtype"] == "bf16" else 4
            peak = gpu.flops["bf16"] if item == 2 else gpu.flops["fp32"]
            # row-major A [m, k] and B, C [., n]: their leading strides k and n, as ops.py _aligned checks them
            aligned = r["k"] * item % ALIGN_BYTES == 0 and r["n"] * item % ALIGN_BYTES == 0
            pred = gemm_s(1, r["m"], r["n"], r["k"], item, peak, sp.sm_count, sp.matmul_efficiency, bw, aligned)
            err = (pred - r["measured_s"]) / r["measured_s"]
            errs.append(abs(err))
            print(f"  gemm {r['name']:<14} {r['m']:>6} x {r['n']:>6} x {r['k']:>6} {r['dtype']:<4} "
                  f"{r['tflops']:7.1f} TFLOP/s  model {err:+7.1%}")
        elif r.get("op") == "sdpa" and r["dtype"] == "bf16" and r["backend"] in ("flash", "efficient", "cudnn"):
            fl = r["forward_flops"] / (2 if r["causal"] else 1)  # the model's causal FLOPs (ops.py): half
            shape = (r["seq"], r["seq"], r["causal"])  # priced by problem shape, as ops.py records SDPA calls
            pred_f = attention_s(fl, r["backend"], "forward", gpu.arch, gpu.flops["bf16"], shape)
            pred_fb = pred_f + attention_s(2.5 * fl, r["backend"], "backward", gpu.arch, gpu.flops["bf16"], shape)
            for what, pred, meas in (("fwd", pred_f, r["forward_s"]), ("fwd+bwd", pred_fb, r["forward_backward_s"])):
                err = (pred - meas) / meas
                errs.append(abs(err))
                print(f"  sdpa {r['backend']:<9} {what:<7} b{r['batch']} h{r['heads']} s{r['seq']} d{r['head_dim']}"
                      f"  {fl * (1 if what == 'fwd' else 3.5) / meas / 1e12:7.1f} TFLOP/s  model {err:+7.1%}")
    if errs:
        print(f"n={len(errs)} median |err| {statistics.median(errs):.1%} max {max(errs):.1%}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="one tiny GEMM and attention (plumbing)")
    ap.add_argument("--budget-s", type=float, default=90.0, help="stop starting measurements after this")
    ap.add_argument("--out", help="JSON lines file (default benchmarks/truth/kernels/<gpu>-ops.jsonl)")
    ap.add_argument("--only", choices=("sdpa", "gemm"), help="only attention or only GEMM measurements")
    ap.add_argument("--compare", metavar="FILE", help="print measured vs model for a measurement file; no GPU")
    ap.add_argument("--gpu", help="with --compare: the catalog GPU (default: the file's)")
    args = ap.parse_args()
    if args.compare:
        return compare(Path(args.compare), args.gpu)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gemm_bench: no CUDA GPU here (use --device cpu --quick for the plumbing)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out = Path(args.out or ROOT / "benchmarks" / "truth" / "kernels" / f"{slug}-ops.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # gpuwise's fp32 step: TF32 only under --precision tf32
    append_line(out, {"op": "env", "gpu_name": name, "torch": torch.__version__, "cuda": torch.version.cuda,
                      "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    deadline = time.monotonic() + args.budget_s
    # attention first (few rows, one per backend), then bf16 GEMMs, then fp32 ones (the largest left out: slow)
    attn = QUICK_ATTENTION if args.quick else ATTENTION
    backends = [None] if device.type != "cuda" else ["flash", "efficient", "cudnn", "math"]
    jobs = [("sdpa", s, ("bf16", b)) for s in attn for b in backends] + [("sdpa", s, ("fp32", None)) for s in attn]
    jobs += [("gemm", s, dt) for dt in ("bf16", "fp32") for s in gemm_shapes(args.quick)
             if dt == "bf16" or s[1] * s[2] * s[3] <= 4096 * 14336 * 8192]
    jobs = [j for j in jobs if args.only in (None, j[0])]
    done = failed = 0
    for kind, shape, spec in jobs:
        if time.monotonic() > deadline:
            print(f"gemm_bench: --budget-s reached, {len(jobs) - done - failed} not run", file=sys.stderr)
            break
        try:
            row = run_gemm(*shape, spec, device) if kind == "gemm" else run_attention(shape, spec[0], spec[1], device)
        except Exception as exc:  # noqa: BLE001 - a backend that does not run here must not lose the others
            failed += 1
            print(f"  {kind} {shape} {spec}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        append_line(out, row)
        done += 1
    print(f"gemm_bench: {done} measurements ({failed} failed) in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
