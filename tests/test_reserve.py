"""Reservations: concurrent pickers in separate processes never share a GPU; stale holders are cleaned up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from gpuwise import devices
from gpuwise.devices import reserve

PICKER = textwrap.dedent("""
    import json, sys, time
    import gpuwise
    start = time.time()
    chosen = gpuwise.pick(1, wait="60s", poll_s=0.02, set_env=False)
    got = time.time()
    time.sleep(0.25)                      # "use" the GPU
    released = time.time()
    chosen.release()
    print(json.dumps({"uuid": chosen.devices[0].uuid, "got": got, "released": released}))
""")


def test_concurrent_pickers_never_share_a_gpu(fake_gpus, tmp_path):
    # 10 processes race for 4 GPUs; each holds one for 0.25 s. Every holding interval on a GPU must be
    # disjoint from every other on the same GPU.
    procs = [subprocess.Popen([sys.executable, "-c", PICKER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ)) for _ in range(10)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    by_gpu: dict[str, list[tuple[float, float]]] = {}
    for r in results:
        by_gpu.setdefault(r["uuid"], []).append((r["got"], r["released"]))
    assert len(by_gpu) >= 2  # the pickers spread over several GPUs
    for uuid, spans in by_gpu.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end, f"{uuid} held by two live processes at once"


def test_process_reservation_dies_with_its_process(fake_gpus):
    # a child reserves the best GPU for itself and exits without releasing (killed): its holder is stale
    code = "import gpuwise, os; gpuwise.pick(1, set_env=False); os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    folder = reserve.lock_dir()
    assert any(n.endswith(".json") for n in os.listdir(folder))  # the file is still there...
    assert reserve.reserved_uuids() == set()                     # ...but its pid is dead: cleaned up
    assert not any(n.endswith(".json") for n in os.listdir(folder))


def test_lease_expires(fake_gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first = devices.pick(1, reserve_for="lease", lease="0.3s", set_env=False)
    assert reserve.reserved_uuids() == {first.devices[0].uuid}
    assert devices.pick(1, set_env=False, reserve_for="none").devices[0].uuid != first.devices[0].uuid
    time.sleep(0.35)
    assert reserve.reserved_uuids() == set()
    assert devices.pick(1, set_env=False, reserve_for="none").devices[0].uuid == first.devices[0].uuid


def test_reused_pid_is_not_a_live_holder(fake_gpus):
    # a holder file naming our own pid but another start time (the pid was reused) is stale
    folder = reserve.lock_dir()
    holder = {"uuid": "GPU-bbbbbbbb-1111-1111-1111-111111111111", "pid": os.getpid(), "pid_start": 1.0,
              "host": None, "expires_at": None}
    with open(os.path.join(folder, "x.json"), "w") as fh:
        json.dump(holder, fh)
    assert reserve.reserved_uuids() == set()
