"""`gpuwise fit`: does the job fit on a GPU (or N), and which changes make it fit or run faster."""

from __future__ import annotations

from ..errors import GpuwiseError
from ..plan.curve import DEFAULT_MARGIN_PCT
from ..plan.fit import fit
from ..plan.fit_gpus import attach_costs, fit_all_gpus
from ..plan.speed.cost import parse_prices
from ..report import console
from ..report.fit import gpus_table, plot_fit, render_fit
from ..report.progress import StageProgress
from .common import (
    add_accum_sync_argument,
    add_compile_argument,
    add_cross_entropy_argument,
    add_gpu_argument,
    add_train_metrics_argument,
    add_workload_arguments,
    positive_int,
)

QUICK_EXIT = True  # nothing is left running or open when run() returns (cli.run exits at once)
HELP = "will it fit on GPU X (or N of them), and how to make it fit: ranked options (no GPU needed)"
EXAMPLES = """\
  gpuwise fit examples/configs/llama-2-7b.json --gpu rtx4090 -b 8 --seq-len 1024
  gpuwise fit hf:Qwen/Qwen2.5-7B --gpu H100 -n 8 --seq-len 2048 --json     # fetches config.json only
  gpuwise fit examples:gpt-mini --gpu all -b 64                            # which GPU should I buy?
  gpuwise fit path/to/job.py --gpu L4 -b 32 --plot fit.png
  gpuwise fit examples/configs/llama-2-7b.json --gpu all -b 8 --seq-len 1024 --tokens 1e9 --price H100=2.49
Each option is traced (fake tensors, the real peft / bitsandbytes / transformers code); for a model
config, layers 1 and 2 are traced and extrapolated. Options that fit come first, fastest first.
"""


def add_arguments(p) -> None:
    add_workload_arguments(p, batch_default=8, configs=True,
                           batch_help="samples per optimizer step on each GPU, split into a micro-batch x "
                                      "gradient accumulation (estimate's -b x --grad-accum)")
    add_gpu_argument(p, every=True, required=True)
    p.add_argument("-n", "--nproc", type=positive_int, default=1, help="number of GPUs (default 1)")
    add_accum_sync_argument(p)
    add_cross_entropy_argument(p)
    add_train_metrics_argument(p)
    add_compile_argument(p)
    p.add_argument("--margin", type=float, default=None, metavar="PCT", help="percent of GPU memory kept free (default 5)")
    p.add_argument("--plot", metavar="FILE", help="chart of the options (memory vs the GPU, samples/s) to FILE")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--tokens", type=float, metavar="N", help="train on N tokens: time and cost per GPU (e.g. 1e9)")
    length.add_argument("--samples", type=float, metavar="N", help="train on N samples: time and cost per GPU")
    p.add_argument("--price", action="append", metavar="GPU=USD", help="rent price per GPU-hour (repeatable), "
                   "e.g. --price H100=2.49; defaults: a dated list (plan/speed/cost.py)")
    p.add_argument("--buy", action="append", metavar="GPU=USD", help="purchase price per GPU for the owning cost "
                   "(repeatable), e.g. --buy rtx4090=1800")


def run(args) -> int:
    from pathlib import Path

    if args.plot and not Path(args.plot).resolve().parent.is_dir():
        raise GpuwiseError(f"--plot {args.plot}: the folder {Path(args.plot).resolve().parent} does not exist")
    margin = DEFAULT_MARGIN_PCT if args.margin is None else args.margin
    if not 0 <= margin < 100:
        raise GpuwiseError(f"--margin must be a percentage in [0, 100), got {margin!r}")
    if args.checkpointing == "selective":
        raise GpuwiseError("fit --checkpointing selective: fit ranks full checkpointing only; "
                           "`gpuwise estimate --checkpointing selective` gives its memory")
    kw = dict(precision=args.precision, optimizer=args.optimizer, checkpointing=args.checkpointing == "full",
              seq_len=args.seq_len, task=args.task, target_len=args.target_len, margin_pct=margin,
              accum_sync=args.accum_sync, cross_entropy=args.cross_entropy or "model",
              train_metrics=args.train_metrics, compile=args.compile)
    with console.err.status("tracing the options with fake tensors…"), StageProgress("fit") as progress:
        if args.gpu.strip().lower() == "all":
            results = fit_all_gpus(args.workload, args.nproc, args.batch_size, progress=progress, **kw)
        else:
            results = [fit(args.workload, args.gpu, args.nproc, args.batch_size, progress=progress, **kw)]
    if args.tokens is not None or args.samples is not None:
        attach_costs(results, args.tokens, args.samples, parse_prices(args.price), parse_prices(args.buy))
    if args.plot:
        try:
            plot_fit(results[0] if len(results) == 1 else max(results, key=lambda r: r.gpu_memory_bytes), args.plot)
        except (OSError, ValueError) as exc:
            raise GpuwiseError(f"--plot {args.plot}: {exc}") from exc
    if args.json:
        if len(results) == 1:
            console.emit_json(results[0].to_dict())
        else:
            console.emit_json({"workload": results[0].workload, "nproc": args.nproc,
                               "gpus": [r.to_dict() for r in results]})
        return 0
    if len(results) == 1:
        render_fit(results[0])
    else:
        console.out.print(gpus_table(results))
    if args.plot:
        console.err.print(f"chart written to {args.plot}")
    return 0
