"""Predicted training throughput against published measurements (benchmarks/published/*.jsonl).

    nice python benchmarks/published_speed.py            # every throughput row with gpuwise_args
    nice python benchmarks/published_speed.py --ids ID1,ID2

For each published throughput row that gpuwise can express (`gpuwise_args` not null) it runs the one
`gpuwise.estimate` call those flags stand for (the CUDA target on the named GPU, -n ranks under
--strategy) and compares `speed.tokens_per_s_per_gpu` (or samples/s) with the published number; the
roofline's rate (plan/flops.py: 100 % of datasheet peak) is reported beside it as the bound, and the memory
model's verdict on the same step (`fits`, at margin 0: a published run had the whole card, where `estimate`'s
default keeps 5 % for a user's safety).
Rows that cannot be expressed are listed with their reason. Nothing is fitted to these rows: the model's
constants are cited in src/gpuwise/plan/speed/ and plan/catalog.py.

Results: benchmarks/results/published_speed.json (written atomically) and the table between the
`published_speed` markers in benchmarks/published/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "published_speed.json")
README = os.path.join(HERE, "published", "README.md")
# every published run predates torch 2.11, the first whose wheels run cuDNN attention first on sm90 (the H100
# rows: torchtitan's table on torch of 2024-12-23, fms-fsdp and llm-foundry of 2023-24): their SDPA ran flash
PUBLISHED_TORCH = "2.6"
# and torch 2.7, the first whose wheels ship NCCL >= 2.22 (lazy connection): their NCCL connected its rings and
# trees when each communicator was created (plan/memory/nccl.py), in every rank's device memory
PUBLISHED_NCCL_CONNECT = "eager"
BEGIN, END = "<!-- published_speed:begin -->", "<!-- published_speed:end -->"
SPEED_METRICS = {"tokens_per_s_per_gpu", "tokens_per_s", "samples_per_s"}

sys.path.insert(0, os.path.join(HERE, "published"))
sys.path.insert(0, os.path.join(ROOT, "src"))


def parse_args(argv: list[str]) -> dict:
    """The estimate flags a row uses -> gpuwise.estimate keyword arguments."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-b", "--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--gpu")
    p.add_argument("-n", "--nproc", type=int, default=1)
    p.add_argument("--strategy")
    p.add_argument("--checkpointing", nargs="?", const="full", default="none")
    p.add_argument("--layer-checkpointing", type=int)
    p.add_argument("--lora", type=int, nargs="?", const=16)
    p.add_argument("--qlora", action="store_true")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--optimizer")
    p.add_argument("--task")
    p.add_argument("--attn")
    p.add_argument("--optimizer-impl", default="default")  # the estimate CLI's version flags (commands/estimate.py)
    p.add_argument("--zero-grad", default="none")
    p.add_argument("--module-loading")
    p.add_argument("--softmax-saves-input", action="store_true")
    p.add_argument("--nccl-connect", default=PUBLISHED_NCCL_CONNECT)
    p.add_argument("--network-gbps", type=float)
    p.add_argument("--fsdp-param-dtype")
    p.add_argument("--fsdp-reduce-dtype")
    p.add_argument("--accum-sync")
    p.add_argument("--cross-entropy")
    p.add_argument("--train-metrics", type=int, default=0)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args(argv)
    return {"batch_size": a.batch_size, "seq_len": a.seq_len, "precision": a.precision, "gpu": a.gpu,
            "nproc": a.nproc, "strategy": a.strategy, "checkpointing": a.checkpointing, "lora": a.lora,
            "layer_checkpointing": a.layer_checkpointing, "task": a.task, "attn": a.attn,
            "qlora": a.qlora, "grad_accum": a.grad_accum, "optimizer": a.optimizer,
            "optimizer_impl": a.optimizer_impl, "zero_grad": a.zero_grad, "module_loading": a.module_loading,
            "softmax_saves_input": a.softmax_saves_input, "nccl_connect": a.nccl_connect, "network_gbps": a.network_gbps,
            "fsdp_param_dtype": a.fsdp_param_dtype,
            "fsdp_reduce_dtype": a.fsdp_reduce_dtype, "accum_sync": a.accum_sync, "cross_entropy": a.cross_entropy,
            "train_metrics": a.train_metrics, "compile": a.compile}


def predict_row(row: dict) -> dict:
    from gpuwise.plan import estimate
    from gpuwise.plan.speed.attention import gpu_torch

    kw = parse_args(row["gpuwise_args"])
    workload = os.path.join(ROOT, row["setting"]["workload"])
    started = time.perf_counter()
    with gpu_torch(PUBLISHED_TORCH):  # margin 0: the run had the whole card (5 % is a user's safety margin)
        est = estimate(workload, kw.pop("batch_size"), target="cuda", search_max_batch=False, margin_pct=0, **kw)
    sp, rl = est.speed, est.roofline
    tokens = (kw["seq_len"] or 0) * est.batch_size * est.grad_accum
    if row["metric"] in ("tokens_per_s_per_gpu", "tokens_per_s"):  # tokens_per_s: all GPUs together
        ranks = 1 if row["metric"] == "tokens_per_s_per_gpu" else max(sp.nproc, 1)
        predicted = sp.tokens_per_s_per_gpu * ranks
        bound = tokens * ranks / rl.time_s if rl and rl.time_s else None
    else:
        predicted = sp.samples_per_s
        bound = rl.samples_per_s * max(sp.nproc, 1) if rl else None
    measured = float(row["value"])
    return {"id": row["id"], "source": row["source"]["name"], "repo": row["source"].get("repo") or row["source"].get("paper"),
            "document": row["source"].get("url"), "gpu": row["setting"]["gpu"],
            "gpus": row["setting"]["gpus"], "model": row["setting"]["model"], "metric": row["metric"],
            "measured": measured, "predicted": predicted, "error_pct": 100 * (predicted - measured) / measured,
            "roofline": bound, "roofline_ratio": measured / bound if bound else None,
            "bound_by": sp.bound_by, "mfu": sp.mfu, "breakdown_s": sp.breakdown, "step_time_s": sp.step_time_s,
            "estimate_s": round(time.perf_counter() - started, 1), "args": row["gpuwise_args"],
            # what the memory model says of the same step on the named card: a run at the edge of memory
            "fits": est.fits, "device_used_bytes": est.device_used_bytes, "gpu_memory_bytes": est.gpu_memory_bytes,
            "retries": est.allocator.retries if est.allocator else None,
            "steady_retries": est.allocator.steady_retries if est.allocator else None}


def measurement_key(row: dict) -> tuple:
    """What one measurement is: the same published number (quote, value, metric) on the same GPUs. Two
    documents quoting one run (transformers' model_memory_anatomy and perf_train_gpu_one print the same
    V100 log lines) are one measurement, whatever their rows' ids."""
    s = row["setting"]
    return (" ".join(str(row["quote"]).split()), float(row["value"]), row["metric"], s["gpu"], s["gpus"])


def group_measurements(rows: list[dict]) -> list[list[dict]]:
    """Expressible rows grouped by measurement, in first-seen order. Within a group the row that states the
    most of the setting (the most estimate flags: e.g. the torch/transformers version flags of the
    2022 run) comes first: it is the one counted; the others are kept as `same_as` duplicates."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(measurement_key(r), []).append(r)
    return [sorted(g, key=lambda r: -len(r["gpuwise_args"])) for g in groups.values()]


def summary(results: list[dict]) -> dict:
    """Over measurements: result rows with `duplicate_of` (another row's quote of the same run) are not
    counted. `sources`: distinct repositories or papers (two doc pages of one repository are one source)."""
    dups = [r for r in results if r.get("duplicate_of")]
    results = [r for r in results if not r.get("duplicate_of")]
    errs = [abs(r["error_pct"]) for r in results]
    return {"measurements": len(results), "duplicate_rows": len(dups),
            "sources": sorted({r.get("repo") or r["source"] for r in results}),
            "documents": len({r["document"] for r in results}),
            "gpu_types": sorted({r["gpu"] for r in results}), "gpus_min": min((r["gpus"] for r in results), default=0),
            "gpus_max": max((r["gpus"] for r in results), default=0),
            "median_abs_error_pct": statistics.median(errs) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None,
            "within_15_pct": sum(e <= 15 for e in errs), "within_30_pct": sum(e <= 30 for e in errs)}


def table(results: list[dict], skipped: list[dict], summ: dict) -> str:
    lines = ["Predicted vs published throughput (`python benchmarks/published_speed.py`; the roofline's rate is "
             "the bound at 100 % of datasheet peak, `measured/roofline` how much of it the real run reached). "
             "One line per measurement: a run quoted by two documents is one measurement, predicted with the "
             "row that states more of its setting (listed under it as `same measurement`).", "",
             "| row | GPUs | measured | predicted | error | roofline | measured/roofline | bound by |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    dups: dict[str, list[str]] = {}
    for r in results:
        if r.get("duplicate_of"):
            dups.setdefault(r["duplicate_of"], []).append(r["id"])
    for r in results:
        if r.get("duplicate_of"):
            continue
        also = f" (same measurement: {', '.join(dups[r['id']])})" if r["id"] in dups else ""
        lines.append(f"| {r['id']}{also} | {r['gpus']} x {r['gpu']} | {r['measured']:,.0f} | {r['predicted']:,.0f} | "
                     f"{r['error_pct']:+.1f} % | {r['roofline']:,.0f} | {r['roofline_ratio']:.2f} | {r['bound_by']} |")
    lines += ["", f"{summ['measurements']} measurements ({summ['duplicate_rows']} more rows quote one of them) from "
              f"{len(summ['sources'])} sources ({', '.join(summ['sources'])}; {summ['documents']} documents), GPU types "
              f"{', '.join(summ['gpu_types'])}, {summ['gpus_min']} to {summ['gpus_max']} GPUs: median |error| "
              f"{summ['median_abs_error_pct']:.1f} %, max {summ['max_abs_error_pct']:.1f} %; "
              f"{summ['within_15_pct']} within 15 %, {summ['within_30_pct']} within 30 %.", ""]
    lines += ["| source | GPU | measurements | median error (signed) | median abs error | max abs error |",
              "|---|---|---:|---:|---:|---:|"]
    groups: dict[tuple, list[float]] = {}
    for r in results:
        if not r.get("duplicate_of"):
            groups.setdefault((r.get("repo") or r["source"], r["gpu"]), []).append(r["error_pct"])
    for (src, gpu), errs in sorted(groups.items()):
        lines.append(f"| {src} | {gpu} | {len(errs)} | {statistics.median(errs):+.1f} % | "
                     f"{statistics.median(abs(e) for e in errs):.1f} % | {max(abs(e) for e in errs):.1f} % |")
    lines += ["", "By how full the memory model says the card is (the same step's `device_used_bytes` over the card, "
              "at margin 0): a run near the top of its memory may lose time the speed model does not price "
              "(cudaMalloc retries, memory outside the model).", "",
              "| predicted share of the card | measurements | median error (signed) | median abs error | "
              "max abs error |", "|---|---:|---:|---:|---:|"]
    for label, errs in by_memory_share(results):
        lines.append(f"| {label} | {len(errs)} | {statistics.median(errs):+.1f} % | "
                     f"{statistics.median(abs(e) for e in errs):.1f} % | {max(abs(e) for e in errs):.1f} % |")
    lines += ["", "Not expressible (recorded, not predicted):", ""]
    lines += [f"- {r['id']}: {r['why_not']}" for r in skipped]
    return "\n".join(lines)


MEMORY_SHARES = (0.8, 0.9, 0.95, 0.98)


def by_memory_share(results: list[dict]) -> list[tuple[str, list[float]]]:
    """The measurements' signed errors grouped by the predicted share of the card their step uses
    (MEMORY_SHARES' bounds; the last group includes steps predicted not to fit); empty groups left out."""
    edges = (0.0, *MEMORY_SHARES, math.inf)
    groups: list[tuple[str, list[float]]] = [
        (f"{lo:.2f} - {hi:.2f}" if hi != math.inf else f">= {lo:.2f}", []) for lo, hi in zip(edges, edges[1:])]
    for r in results:
        if r.get("duplicate_of") or not r.get("device_used_bytes") or not r.get("gpu_memory_bytes"):
            continue
        share = r["device_used_bytes"] / r["gpu_memory_bytes"]
        i = next(i for i, hi in enumerate(edges[1:]) if share < hi)
        groups[i][1].append(r["error_pct"])
    return [(label, errs) for label, errs in groups if errs]


def write_readme(body: str) -> None:
    text = open(README).read()
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n## Throughput results\n\n" + block + "\n"
    write_atomic(README, text)


def write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", help="comma-separated row ids (default: all throughput rows)")
    ap.add_argument("--render", action="store_true", help="only rewrite the README table from the results file")
    args = ap.parse_args()
    from corpus import load_rows

    all_rows = [r for r in load_rows() if r["metric"] in SPEED_METRICS]
    skipped = [{"id": r["id"], "why_not": r["why_not"]} for r in all_rows if r["gpuwise_args"] is None]
    duplicate_of = {d["id"]: g[0]["id"] for g in group_measurements([r for r in all_rows if r["gpuwise_args"]])
                    for d in g[1:]}
    if args.render:
        saved = json.load(open(RESULTS))
        src = {r["id"]: r["source"] for r in all_rows}
        for r in saved["rows"]:  # results written before the repo key existed
            r.setdefault("repo", src.get(r["id"], {}).get("repo"))
        results = mark_duplicates(saved["rows"], duplicate_of)
        summ = summary(results)
        write_readme(table(results, skipped, summ))
        write_atomic(RESULTS, json.dumps({**saved, "summary": summ, "rows": results}, indent=1) + "\n")
        print(json.dumps(summ, indent=1))
        return 0

    rows = [r for r in all_rows if r["gpuwise_args"] is not None]
    if args.ids:
        wanted = set(args.ids.split(","))
        rows = [r for r in rows if r["id"] in wanted]
    saved = {r["id"]: r for r in json.load(open(RESULTS))["rows"]} if args.ids and os.path.exists(RESULTS) else {}
    order = [r["id"] for r in all_rows]

    def save(results: list[dict]) -> tuple[list[dict], dict]:
        """The results so far (with --ids, merged into the saved ones: the other rows keep theirs), written
        atomically after every row: an interrupted run loses nothing it predicted."""
        merged = {**saved, **{r["id"]: r for r in results}}
        rows_out = sorted((r for r in merged.values() if r["id"] in order), key=lambda r: order.index(r["id"]))
        rows_out = mark_duplicates(rows_out, duplicate_of)
        summ = summary(rows_out)
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        write_atomic(RESULTS, json.dumps({"summary": summ, "rows": rows_out, "not_expressible": skipped}, indent=1)
                     + "\n")
        return rows_out, summ

    results = []
    for row in rows:
        if row["id"] in duplicate_of:  # one measurement, predicted once (with the row that states more)
            results.append({"id": row["id"], "duplicate_of": duplicate_of[row["id"]], "args": row["gpuwise_args"]})
            continue
        print(f"{row['id']} ...", file=sys.stderr, flush=True)
        res = predict_row(row)
        print(f"  measured {res['measured']:,.0f} predicted {res['predicted']:,.0f} ({res['error_pct']:+.1f} %)",
              file=sys.stderr, flush=True)
        results.append(res)
        save(results)
    results, summ = save(results)
    write_readme(table(results, skipped, summ))
    print(json.dumps(summ, indent=1))
    return 0


def mark_duplicates(results: list[dict], duplicate_of: dict[str, str]) -> list[dict]:
    """Rows quoting a measurement another row predicts: kept as `{id, duplicate_of, args}` only."""
    return [{"id": r["id"], "duplicate_of": duplicate_of[r["id"]], "args": r.get("args")}
            if r["id"] in duplicate_of else r for r in results]


if __name__ == "__main__":
    raise SystemExit(main())
