#!/usr/bin/env bash
# Everything gpuwise must show on a real GPU, in phases that each fit one 10-minute call of a lent
# GPU machine (no network there: gpuwise runs from the source tree with the packages already present).
#
#   bash benchmarks/gpu_session.sh check    # gpus/pick/run on real NVML + every test marked `gpu` (~5 min)
#   bash benchmarks/gpu_session.sh truth    # the truth corpus, resumable: call again until it says done (~9 min a call)
#   bash benchmarks/gpu_session.sh bench    # truth error table, tune benchmark on the GPU, watch report, scale -n 1 (~8 min)
#   bash benchmarks/gpu_session.sh lease    # one ~9-minute call for a 15-minute lease: versions, truth first
#                                           # (resumes), per-kernel times by class and GEMM/attention kernels alone
#                                           # (where this GPU has none on record), step time under memory
#                                           # pressure, the attention kernels torch picks, gpu tests,
#                                           # scale/train/watch
#
# Results go to $OUT (or ./gpu-out): logs, and benchmarks/truth/*.jsonl to copy back into the repo.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p /tmp/gpuwise-bin && printf '#!/bin/sh\nexec python3 -m gpuwise "$@"\n' > /tmp/gpuwise-bin/gpuwise
chmod +x /tmp/gpuwise-bin/gpuwise; export PATH=/tmp/gpuwise-bin:$PATH

versions() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
}

case "${1:-check}" in
  check)
    { versions; echo "== gpuwise gpus"; gpuwise gpus --processes
      echo "== gpuwise pick --json"; gpuwise pick --json
      echo "== gpuwise run"; gpuwise run -- python3 -c 'import os, torch; print(os.environ["CUDA_VISIBLE_DEVICES"], torch.cuda.get_device_name(0))'
      echo "== gpuwise doctor"; gpuwise doctor; echo "exit $?"
      echo "== gpuwise doctor --json"; gpuwise doctor --json > "$OUT/doctor.json"; echo "exit $?"
      echo "== gpuwise demo"; gpuwise demo examples:gpt-mini --batch-size 16 --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      echo "== gpu tests"; python3 -m pytest -q -m gpu -p no:cacheprovider tests
    } 2>&1 | tee "$OUT/check.log" ;;
  truth)
    python3 benchmarks/truth/collect.py --budget-min 8 2>&1 | tee "$OUT/truth.log"
    cp benchmarks/truth/*.jsonl benchmarks/truth/*.json "$OUT"/ 2>/dev/null ;;
  bench)
    { versions
      echo "== truth errors"; python3 benchmarks/truth_errors.py
      echo "== tune"; timeout 240 python3 benchmarks/tune_imagefolder.py --device cuda --budget 2m
      echo "== watch: data-starved (unmodified script)"; gpuwise watch --report "$OUT/watch-gpu-starved.html" -- python3 tests/scripts/starved.py
      echo "== watch: data-starved (gpuwise.monitor loop)"; gpuwise watch --report "$OUT/watch-gpu.html" -- python3 examples/train_with_monitor.py --steps 200
      echo "== watch: compute-bound"; gpuwise watch --report "$OUT/watch-gpu-compute.html" -- python3 examples/train_with_monitor.py --steps 200 --read-ms 0 --workers 4 --pin-memory
      echo "== watch: clocks and PCIe link"; gpuwise watch --json -- python3 examples/train_with_monitor.py --steps 200 \
        | python3 -c 'import json,sys; s=json.load(sys.stdin); print(json.dumps(s.get("gpu_health"))); print([f["kind"] for f in s["findings"]])'
      echo "== scale (NCCL)"; gpuwise scale examples:gpt-mini -n 1 --batch-size 16 --steps 20
      echo "== train (NCCL)"; gpuwise train examples:gpt-mini -n 1 --batch-size 16 --steps 50 --checkpoint-dir "$OUT/ckpt" --json
      echo "== roofline vs measured: see 'measured_over_roofline' in the truth errors above"
    } 2>&1 | tee "$OUT/bench.log" ;;
  lease)
    { versions; echo "== gpuwise gpus"; gpuwise gpus --processes; gpuwise doctor --json > "$OUT/doctor.json"
      # this GPU's records only: at most 8 files come back from a lease
      slug=$(python3 -c 'import torch; from gpuwise.plan.catalog import gpu_slug; print(gpu_slug(torch.cuda.get_device_name(0)))')
      echo "== truth (published sizes first; resumable)"
      timeout 210 python3 benchmarks/truth/collect.py --budget-min 2.6; echo "truth exit $?"
      cp "benchmarks/truth/$slug.jsonl" "$OUT"/ 2>/dev/null
      if [ -s "benchmarks/truth/kernels/$slug.jsonl" ]; then  # this GPU's kernel classes are on record: skip them
        echo "== kernels: benchmarks/truth/kernels/$slug.jsonl already on record"
      else
        echo "== kernels by class (speed model check)"; timeout 150 python3 benchmarks/truth/profile_kernels.py
        echo "== GEMM and attention kernels alone (speed model constants)"; timeout 75 python3 benchmarks/truth/gemm_bench.py --budget-s 60
      fi
      echo "== step time under memory pressure"; timeout 170 python3 benchmarks/truth/pressure.py --timeout 75
      echo "== attention kernels torch picks (vs the estimate's: attention_kernels.py --compare)"
      timeout 90 python3 benchmarks/truth/attention_kernels.py
      for f in benchmarks/truth/kernels/"$slug"*.jsonl; do cp "$f" "$OUT/kernels-$(basename "$f")"; done 2>/dev/null
      # tune's own GPU test spends its 180 s budget in isolated trials: it runs in `check`, not here
      echo "== gpu tests"; timeout 100 python3 -m pytest -q -m gpu -k "not test_tune_on_a_real_gpu" -p no:cacheprovider tests
      echo "tests exit $?"
      echo "== scale (NCCL)"; timeout 30 gpuwise scale examples:gpt-mini -n 1 --batch-size 16 --steps 20
      echo "== train (NCCL)"; timeout 30 gpuwise train examples:gpt-mini -n 1 --batch-size 16 --steps 50 --json
      echo "== watch: data-starved (unmodified script)"
      timeout 30 gpuwise watch --report "$OUT/watch-gpu-starved.html" -- python3 tests/scripts/starved.py
      cp "benchmarks/truth/$slug.jsonl" "$OUT"/ 2>/dev/null
    } 2>&1 | tee "$OUT/lease.log" ;;
  *) echo "usage: $0 check|truth|bench|lease" >&2; exit 2 ;;
esac
