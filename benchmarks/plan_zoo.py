"""The planner's CPU target on an architecture zoo: every transformers family plus plain-PyTorch ones.

    nice python benchmarks/plan_zoo.py            # every case (resumes: done cases are kept)
    nice python benchmarks/plan_zoo.py --quick    # a ~30-case subset
    python benchmarks/plan_zoo.py --fresh         # forget earlier results and start over
    python benchmarks/plan_zoo.py --table         # print the table of what is recorded, run nothing

For each case (benchmarks/zoo_cases.py: a model, a batch, an optimizer, a precision, checkpointing on
or off) the truth is PyTorch's profiler peak of a real steady CPU step
(`gpuwise.plan.tracing.cpu_truth.measure_cpu`), and the estimate is `gpuwise.plan.tracing.trace.trace_step(target="cpu")`.
A model with LayerDrop (wav2vec2, HuBERT, M2M-100, ...) skips blocks at random, so one real step is one
draw: its truth is measured with layer drop off, the step that runs every block (where a run's peak comes
from); the planner gets the model as configured.
Cases run in a worker process, one after another; a case that kills or hangs the worker is recorded
(crash / timeout, with the stage it was in) and the worker is restarted for the next one. Each result is
appended to benchmarks/results/plan_zoo.jsonl as it comes, so an interrupted run resumes where it stopped;
the summary (table and counts) goes to benchmarks/results/plan_zoo.json.

Statuses: ok (both ran; error is the signed percentage of the truth), skip (the model does not build
offline from its default config, or its real step fails: not the planner's business), crash / timeout
(the real step worked and the planner did not).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_JSONL = os.path.join(HERE, "results", "plan_zoo.jsonl")
RESULTS_JSON = os.path.join(HERE, "results", "plan_zoo.json")
MARK = "@@ZOO "
TOLERANCE_PCT = 1.0
QUICK_HF = ("gpt2", "llama", "bert", "t5", "vit", "resnet", "convnext", "wav2vec2", "mixtral", "mamba",
            "whisper", "mobilenet_v2", "swin", "bart", "qwen2_moe")


def case_ids(quick: bool) -> list[str]:
    """Every case's id, `<family>:<name>:<variant index>`: each architecture's baseline (AdamW, fp32), and
    the other variants (optimizers, bf16, checkpointing) spread over the architectures in turn."""
    sys.path.insert(0, HERE)
    import zoo_cases as zc

    hf = [m for m, _, _ in zc.hf_registry()]
    plain = list(zc.torch_cases())
    if quick:
        hf = [m for m in hf if m in QUICK_HF]
        plain = plain[::3]
    ids = [f"torch:{n}:0" for n in plain] + [f"hf:{m}:0" for m in hf]
    extra = len(zc.VARIANTS) - 1
    for i, name in enumerate(plain):  # every plain family with one other variant, rotating
        ids.append(f"torch:{name}:{1 + i % extra}")
    step = 1 if quick else 4
    for i, m in enumerate(hf[::step]):  # every 4th transformers family with one other variant
        ids.append(f"hf:{m}:{1 + i % extra}")
    return ids


# -- worker ----------------------------------------------------------------------------------------------

def _emit(obj: dict) -> None:
    os.write(1, (MARK + json.dumps(obj) + "\n").encode())


def _build(case_id: str):
    import zoo_cases as zc

    family, name, variant = case_id.split(":")[0], case_id.split(":")[1], int(case_id.rsplit(":", 1)[1])
    if family == "hf":
        task, cls = next((t, c) for m, t, c in zc.hf_registry() if m == name)
        wl, truth_wl, batch, note = zc.hf_workload(name, task, cls)
        note = f"{task}, {note}"
    else:
        wl, batch, note = zc.torch_cases()[name]
        truth_wl = wl
    return wl, truth_wl, batch, note, zc.VARIANTS[variant]


def run_case(case_id: str, known: dict | None = None) -> dict:
    import gc

    import zoo_cases as zc

    from gpuwise.plan.memory.events import live_peak
    from gpuwise.plan.tracing.cpu_truth import measure_cpu
    from gpuwise.plan.tracing.trace import trace_step
    from gpuwise.step import StepConfig

    row: dict = {"id": case_id}
    stage = "build"
    try:
        _emit({"stage": stage, "id": case_id})
        wl, truth_wl, batch, note, variant = _build(case_id)
        opt, prec, ckpt = variant
        config = StepConfig(optimizer=opt, precision=prec, checkpointing=ckpt)
        row.update(model=case_id.rsplit(":", 1)[0], variant=zc.variant_label(variant), batch_size=batch, note=note)
        stage = "truth"
        _emit({"stage": stage, "id": case_id})
        t0 = time.perf_counter()
        if known:  # --retrace: the profiler's truth does not depend on the planner; keep the recorded one
            row.update(truth_bytes=known["truth_bytes"], step_s=known["step_s"], truth="recorded")
        else:
            row.update(truth_bytes=measure_cpu(truth_wl, batch, config).peak_bytes,
                       step_s=round(time.perf_counter() - t0, 3))
        gc.collect()
        stage = "trace"
        _emit({"stage": stage, "id": case_id})
        t0 = time.perf_counter()
        trace = trace_step(wl, batch, config, target="cpu")
        seconds = time.perf_counter() - t0
        peak = live_peak(trace)
        row.update(status="ok", estimate_bytes=peak.allocated_bytes, trace_s=round(seconds, 3), method=trace.method,
                   error_pct=round(100 * (peak.allocated_bytes - row["truth_bytes"]) / row["truth_bytes"], 3),
                   peak_at=f"{peak.phase}/{peak.op}", notes=trace.notes[:3])
    except BaseException as exc:  # noqa: BLE001 - every failure is a row
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        row.update(status="crash" if stage == "trace" else "skip", stage=stage, error=f"{type(exc).__name__}: {first}")
        if stage == "trace":
            row["traceback"] = traceback.format_exc()[-1500:]
    gc.collect()
    return row


def worker() -> int:
    sys.path.insert(0, HERE)
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for line in sys.stdin:
        if line.strip():
            msg = json.loads(line)
            _emit({"result": run_case(msg["id"], msg.get("known"))})
    return 0


# -- parent ----------------------------------------------------------------------------------------------

def _load() -> dict[str, dict]:
    done: dict[str, dict] = {}
    if os.path.exists(RESULTS_JSONL):
        for line in open(RESULTS_JSONL):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[row["id"]] = row
    return done


class Worker:
    def __init__(self):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)

    def run(self, case_id: str, timeout_s: float, known: dict | None = None) -> dict:
        import selectors

        self.proc.stdin.write(json.dumps({"id": case_id, "known": known}) + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        stage, deadline = "start", time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return {"id": case_id, "status": "timeout" if stage == "trace" else "skip", "stage": stage,
                        "error": f"over {timeout_s:.0f}s in {stage}"}
            if not sel.select(timeout=min(left, 5)):
                continue
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                return {"id": case_id, "status": "crash" if stage == "trace" else "skip", "stage": stage,
                        "error": f"worker died (exit {code}) in {stage}"}
            if line.startswith(MARK):
                msg = json.loads(line[len(MARK):])
                if "result" in msg:
                    return msg["result"]
                stage = msg.get("stage", stage)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def alive(self) -> bool:
        return self.proc.poll() is None


# Misses classified by hand (case-id prefix -> cause), reported next to each miss in the summary
CAUSES = {
    "torch:compiled-": "torch.compile (inductor) fuses conv+BN+ReLU and frees what eager keeps; the tracer "
                       "runs the module eagerly: over (the safe direction), and the estimate says so "
                       "('compiled: upper bound')",
}


def cause_of(case_id: str) -> str:
    return next((c for prefix, c in CAUSES.items() if case_id.startswith(prefix)), "not classified")


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("status") == "ok"]
    within = [r for r in ok if abs(r["error_pct"]) <= TOLERANCE_PCT]
    under = sorted(ok, key=lambda r: r["error_pct"])
    return {
        "cases": len(rows), "measured": len(ok), "within_1pct": len(within),
        "within_1pct_share": round(len(within) / len(ok), 4) if ok else None,
        "worst_under_pct": under[0]["error_pct"] if under else None,
        "worst_over_pct": under[-1]["error_pct"] if under else None,
        "under_2pct": sum(r["error_pct"] < -2 for r in ok),
        "crashes": sum(r.get("status") in ("crash", "timeout") for r in rows),
        "skipped": sum(r.get("status") == "skip" for r in rows),
        "fallbacks": sum(r.get("method", "fake-trace") != "fake-trace" for r in ok),
        "misses": [{"id": r["id"], "error_pct": r["error_pct"], "peak_at": r.get("peak_at", ""),
                    "cause": cause_of(r["id"])} for r in ok if abs(r["error_pct"]) > TOLERANCE_PCT],
        "failures": [{"id": r["id"], "status": r["status"], "error": r.get("error", "")}
                     for r in rows if r.get("status") in ("crash", "timeout")],
    }


def table(rows: list[dict]) -> str:
    out = [f"{'case':44s} {'variant':20s} {'status':8s} {'truth MiB':>10s} {'est MiB':>10s} {'error':>9s} "
           f"{'step s':>7s} {'trace s':>8s}  method / why"]
    for r in rows:
        if r.get("status") == "ok":
            out.append(f"{r['model']:44s} {r['variant']:20s} ok       {r['truth_bytes'] / 2**20:10.2f} "
                       f"{r['estimate_bytes'] / 2**20:10.2f} {r['error_pct']:+8.2f}% {r['step_s']:7.2f} "
                       f"{r['trace_s']:8.2f}  {r['method']}")
        elif r.get("status") in ("crash", "timeout"):
            out.append(f"{r['id']:44s} {r.get('variant', ''):20s} {r['status']:8s} {'':43s}  {r.get('error', '')[:90]}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a ~30-case subset")
    ap.add_argument("--fresh", action="store_true", help="discard recorded results first")
    ap.add_argument("--table", action="store_true", help="only print what is recorded")
    ap.add_argument("--only", default="", help="run only case ids containing this text")
    ap.add_argument("--redo", default="", help="rerun recorded cases whose id contains this text ('*': all)")
    ap.add_argument("--retrace", action="store_true",
                    help="with --redo: keep the recorded truth of measured cases and rerun only the planner")
    ap.add_argument("--exclude", default="", help="comma-separated texts: skip case ids containing any")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per case (default 240)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker()
    os.makedirs(os.path.dirname(RESULTS_JSONL), exist_ok=True)
    if args.fresh and os.path.exists(RESULTS_JSONL):
        os.remove(RESULTS_JSONL)
    ids = case_ids(args.quick)
    if args.only:
        ids = [i for i in ids if args.only in i]
    done = _load()
    redo = (lambda i: True) if args.redo == "*" else (lambda i: bool(args.redo) and args.redo in i)
    todo = [i for i in ids if args.table is False and (i not in done or redo(i))]
    if args.retrace:
        todo = [i for i in todo if done.get(i, {}).get("status") == "ok"]
    if args.exclude:
        todo = [i for i in todo if not any(x and x in i for x in args.exclude.split(","))]
    started = time.monotonic()
    w: Worker | None = None
    for n, case_id in enumerate(todo, 1):
        if w is None or not w.alive():
            w = Worker()
        old = done.get(case_id, {})
        known = ({"truth_bytes": old["truth_bytes"], "step_s": old["step_s"]}
                 if args.retrace and old.get("status") == "ok" else None)
        row = w.run(case_id, args.timeout, known)
        done[case_id] = row
        with open(RESULTS_JSONL, "a") as f:
            f.write(json.dumps(row) + "\n")
        err = f"{row['error_pct']:+.2f}%" if row.get("status") == "ok" else row.get("error", "")[:100]
        print(f"[{n}/{len(todo)} {time.monotonic() - started:6.0f}s] {case_id:40s} {row.get('status'):7s} {err}",
              file=sys.stderr, flush=True)
    if w is not None and w.alive():
        w.proc.stdin.close()
        w.proc.wait()
    rows = [done[i] for i in ids if i in done]
    print(table(rows))
    s = summarize(rows)
    for m in s["misses"]:
        print(f"miss {m['id']:40s} {m['error_pct']:+7.2f}%  {m['cause']}")
    print(f"\n{len(ids)} cases enumerated, {s['cases']} run; {s['measured']} measured of {s['cases']} cases ({s['skipped']} skipped: do not build offline or their "
          f"real step fails); {s['within_1pct']}/{s['measured']} within {TOLERANCE_PCT}%; worst under "
          f"{s['worst_under_pct']}%, worst over {s['worst_over_pct']}%; {s['crashes']} crashes; "
          f"{s['fallbacks']} fell back to a real-tensor trace")
    import torch

    result = {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
              "quick": args.quick, "enumerated": len(ids), "summary": s, "rows": rows}
    if not args.only:
        with open(RESULTS_JSON, "w") as f:
            json.dump(result, f, indent=1)
        print(f"full results: {os.path.relpath(RESULTS_JSON)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
