"""`gpuwise launch`: the pure environment / torchrun-argument functions, GPU picking with fake GPUs,
and one real torchrun run of 2 CPU ranks."""

from __future__ import annotations

import json
import os

import pytest

from gpuwise import cli
from gpuwise.devices import reserve
from gpuwise.errors import GpuwiseError
from gpuwise.scaleout import launch as launching


def test_environment_for_gpus_and_cpu_ranks():
    gpu = launching.launch_environment(cuda_visible_devices="1,2", nproc_per_node=2, cpu_count=16, base_env={})
    assert gpu["CUDA_VISIBLE_DEVICES"] == "1,2" and gpu["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert gpu["GPUWISE_DIST_BACKEND"] == "nccl" and "OMP_NUM_THREADS" not in gpu
    cpu = launching.launch_environment(cuda_visible_devices=None, nproc_per_node=4, cpu_count=16, base_env={})
    assert cpu["GPUWISE_DIST_BACKEND"] == "gloo" and cpu["OMP_NUM_THREADS"] == "4"  # 16 cores / 4 ranks
    assert cpu["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    kept = launching.launch_environment(cuda_visible_devices=None, nproc_per_node=4, cpu_count=2,
                                        base_env={"OMP_NUM_THREADS": "3", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})
    assert kept == {"GPUWISE_DIST_BACKEND": "gloo"}  # the user's settings win


@pytest.mark.parametrize("cmd, expected", [
    (["train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    (["python", "train.py", "-x"], ["train.py", "-x"]),
    (["python3", "-m", "pkg.train", "--a"], ["--module", "pkg.train", "--a"]),
    (["./run.sh", "x"], ["--no-python", "./run.sh", "x"]),
])
def test_target_args(cmd, expected):
    assert launching.target_args(cmd) == expected


def test_target_args_errors():
    with pytest.raises(GpuwiseError):
        launching.target_args([])
    with pytest.raises(GpuwiseError):
        launching.target_args(["python", "-u", "train.py"])


def test_torchrun_args_single_and_multi_node():
    assert launching.torchrun_args(["t.py"], nproc_per_node=2, max_restarts=3) == [
        "--nproc-per-node", "2", "--standalone", "--max-restarts", "3", "t.py"]
    assert launching.torchrun_args(["t.py"], nproc_per_node=8, nnodes=2, node_rank=1, rdzv_endpoint="n0:29400",
                                   rdzv_id="job1") == [
        "--nproc-per-node", "8", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29400",
        "--rdzv-id", "job1", "t.py"]  # c10d assigns node ranks on arrival
    assert launching.torchrun_args(["t.py"], nproc_per_node=8, nnodes=2, node_rank=1, rdzv_endpoint="n0:29400",
                                   rdzv_backend="static")[-3:] == ["--node-rank", "1", "t.py"]
    with pytest.raises(GpuwiseError, match="rdzv-endpoint"):
        launching.torchrun_args(["t.py"], nproc_per_node=1, nnodes=2)


def test_prepare_picks_and_reserves_fake_gpus(fake_gpus):
    # four_gpus.json: GPUs 1 and 3 have 80 GB; 1 is idle and nearly empty, then 2 (22.5 GB free), 3 (72 GB free)
    plan = launching.prepare(["t.py"], nproc_per_node=2, min_free="20GiB")
    try:
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "1,3" and plan.backend == "nccl"
        assert plan.torchrun_args[:2] == ["--nproc-per-node", "2"]
        held = reserve.reserved_uuids()
        assert {g.uuid for g in plan.reservation.devices} == held
        # a second job at the same moment gets the remaining qualifying GPU, not the held ones
        other = launching.prepare(["t.py"], nproc_per_node=1, min_free="20GiB")
        assert other.env["CUDA_VISIBLE_DEVICES"] == "2"
        other.release()
    finally:
        plan.release()
    assert reserve.reserved_uuids() == set()


def test_without_nproc_every_qualifying_gpu_gets_a_rank(fake_gpus):
    # four_gpus.json: 3 of the 4 GPUs have >= 20 GiB free (1, 3, 2 in order of free memory)
    plan = launching.prepare(["t.py"], min_free="20GiB")
    try:
        assert plan.nproc_per_node == 3 and plan.env["CUDA_VISIBLE_DEVICES"] == "1,3,2"  # best first
    finally:
        plan.release()


def test_launch_dry_run_json(fake_gpus, capsys):
    assert cli.main(["launch", "-n", "2", "--dry-run", "--json", "--", "python", "train.py", "--epochs", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 2 and out["env"]["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert out["torchrun_args"] == ["--nproc-per-node", "2", "--standalone", "train.py", "--epochs", "3"]


def test_launch_runs_cpu_ranks_and_passes_the_exit_code_through(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("GPUWISE_FAKE_GPUS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # gpuwise splits the cores between the ranks
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        f"folder = {str(tmp_path)!r}\n"
        "r = os.environ['RANK']\n"
        "open(os.path.join(folder, 'rank' + r), 'w').write(' '.join(os.environ[k] for k in\n"
        "    ('WORLD_SIZE', 'LOCAL_RANK', 'GPUWISE_DIST_BACKEND', 'OMP_NUM_THREADS')))\n"
        "sys.exit(3 if r == '1' else 0)\n")
    code = cli.main(["launch", "-n", "2", "--device", "cpu", "--", str(script)])
    capfd.readouterr()
    assert code == 1  # torchrun's code for a failed rank (rank 1 exited 3), passed through
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    assert (tmp_path / "rank0").read_text() == f"2 0 gloo {threads}"
    assert (tmp_path / "rank1").read_text() == f"2 1 gloo {threads}"
