"""On a real GPU: `gpuwise train` and `gpuwise scale` with one rank on NCCL (skipped without CUDA)."""

from __future__ import annotations

import json

import pytest
import torch

from gpuwise import cli

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _one_json(capfd, argv: list[str]) -> dict:
    code = cli.main(argv)
    out, err = capfd.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_train_one_gpu_rank_on_nccl(capfd, tmp_path):
    result = _one_json(capfd, ["train", "examples:mlp", "-n", "1", "--device", "cuda", "--steps", "20", "-b", "64",
                               "--checkpoint-dir", str(tmp_path), "--json"])
    assert (result["world_size"], result["backend"], result["device"]) == (1, "nccl", "cuda")
    assert result["samples_per_s"] > 0 and result["checkpoint"]


def test_scale_one_gpu_rank_on_nccl(capfd):
    result = _one_json(capfd, ["scale", "examples:lenet", "-n", "1", "--device", "cuda", "--steps", "5", "-b", "64",
                               "--json"])
    (point,) = result["points"]
    assert result["backend"] == "nccl" and point["efficiency"] == pytest.approx(1.0)
    assert point["compute_s"] > 0


def test_rng_states_of_a_checkpoint_loaded_onto_the_gpu_can_be_restored(tmp_path):
    # `gpuwise train` loads its checkpoint with map_location=cuda:N, which moves the RNG ByteTensors too
    from gpuwise.scaleout import checkpoint

    torch.cuda.init()
    checkpoint.save(str(tmp_path), checkpoint.Checkpoint(step=1, epoch=0, model={}, optimizer={}, scaler=None,
                                                         rng=[checkpoint.rng_state()], world_size=1, meta={}))
    ckpt = checkpoint.load(str(tmp_path), map_location=torch.device("cuda", 0))
    assert ckpt.rng[0]["torch"].device.type == "cuda"
    checkpoint.set_rng_state(ckpt.rng[0])
    a = (torch.rand(3), torch.rand(3, device="cuda"))
    checkpoint.set_rng_state(ckpt.rng[0])
    assert torch.equal(torch.rand(3), a[0]) and torch.equal(torch.rand(3, device="cuda"), a[1])
