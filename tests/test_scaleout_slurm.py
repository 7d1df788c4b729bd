"""Inside a SLURM allocation `launch` / `train` read the nodes, node rank and rendezvous from SLURM's variables;
`--sbatch FILE` writes a job script (srun + torchrun c10d) that is read back here."""

from __future__ import annotations

import json
import subprocess

import pytest

from gpuwise.cli import main
from gpuwise.errors import GpuwiseError
from gpuwise.scaleout import slurm

SLURM = {"SLURM_JOB_NODELIST": "node[01-03,07]", "SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_PROCID": "2",
         "SLURM_JOB_ID": "4242"}


def test_expand_nodelist():
    assert slurm.expand_nodelist("node[01-03,07]") == ["node01", "node02", "node03", "node07"]
    assert slurm.expand_nodelist("gpu5") == ["gpu5"]
    assert slurm.expand_nodelist("a[8-10],b1,c[1,3]-ib") == ["a8", "a9", "a10", "b1", "c1-ib", "c3-ib"]
    with pytest.raises(GpuwiseError):
        slurm.expand_nodelist("n[x-2]")


def test_slurm_job_from_the_environment():
    job = slurm.slurm_job(SLURM)
    assert job.nodes[0] == "node01" and job.nnodes == 4 and job.node_rank == 2 and job.proc_id == 2
    assert job.rdzv_endpoint == "node01:29400" and job.job_id == "4242"
    assert slurm.slurm_job({}) is None
    with pytest.raises(GpuwiseError, match="SLURM_NNODES=3"):
        slurm.slurm_job({**SLURM, "SLURM_NNODES": "3"})
    # the user's own rendezvous wins; a one-node allocation needs none (torchrun --standalone)
    assert slurm.launch_settings(SLURM, nnodes=1, rdzv_endpoint="h:1", rdzv_id=None) is None
    assert slurm.launch_settings({**SLURM, "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1"}, nnodes=1,
                                 rdzv_endpoint=None, rdzv_id=None) is None


def test_launch_inside_an_allocation_uses_slurms_nodes_and_rendezvous(monkeypatch, capsys):
    for k, v in SLURM.items():
        monkeypatch.setenv(k, v)
    assert main(["launch", "-n", "2", "--device", "cpu", "--dry-run", "--json", "--", "train.py"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nnodes"] == 4 and out["world_size"] == 8
    args = out["torchrun_args"]
    assert args[args.index("--rdzv-endpoint") + 1] == "node01:29400"
    assert args[args.index("--rdzv-id") + 1] == "4242" and args[args.index("--rdzv-backend") + 1] == "c10d"


def test_sbatch_script_read_back(tmp_path, capsys):
    path = tmp_path / "job.sh"
    assert main(["launch", "--nnodes", "3", "-n", "4", "--sbatch", str(path), "--json", "--", "train.py",
                 "--lr", "0.1"]) == 0
    assert json.loads(capsys.readouterr().out)["nnodes"] == 3
    text = path.read_text()
    subprocess.run(["bash", "-n", str(path)], check=True)  # valid shell
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --ntasks-per-node=1" in lines
    assert "#SBATCH --gpus-per-node=4" in lines
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert srun.endswith("torchrun --nnodes $SLURM_NNODES --nproc-per-node 4 --rdzv-backend c10d "
                         "--rdzv-endpoint $head_node:29400 --rdzv-id $SLURM_JOB_ID train.py --lr 0.1")


def test_train_sbatch_writes_the_job_the_ranks_run(tmp_path, capsys):
    path = tmp_path / "train.sh"
    assert main(["train", "examples:mlp", "--device", "cpu", "--nnodes", "2", "-n", "2", "--steps", "5",
                 "--sbatch", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    job = json.loads(open(out["job"]).read())
    assert job["mode"] == "train" and job["config"]["steps"] == 5 and job["config"]["result_path"] == out["result"]
    text = path.read_text()
    assert "export GPUWISE_DIST_BACKEND=gloo" in text and "--gpus-per-node" not in text
    assert f"--module gpuwise.scaleout.worker {out['job']}" in text
