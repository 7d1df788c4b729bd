"""`gpuwise train`: 2 CPU ranks (gloo) under torchrun give the same parameters as single-process
training on the full batch, and a job whose rank dies is restarted by torchrun and resumes from its
checkpoint."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from gpuwise import cli
from gpuwise.contracts import validate
from gpuwise.scaleout import checkpoint
from gpuwise.scaleout.dataparallel import data_parallel_message, find_data_parallel, unwrap_data_parallel
from gpuwise.workload import load_workload

WORKLOAD = textwrap.dedent("""
    import torch
    from torch.nn import functional as F

    def model():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

    def batch(batch_size):
        return torch.randn(batch_size, 8), torch.randn(batch_size, 4)

    def loss(model, batch):
        x, y = batch
        return F.mse_loss(model(x), y)

    def dataset():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=g)
        return torch.utils.data.TensorDataset(x, x[:, :4] * 2 + 0.1 * torch.randn(64, 4, generator=g))
""")
WORLD, BATCH, STEPS, LR = 2, 8, 6, 1e-2  # 64 samples / 2 ranks / batch 8 = 4 steps per epoch: 6 steps cross one


@pytest.fixture
def workload_file(tmp_path):
    path = tmp_path / "tiny_job.py"
    path.write_text(WORKLOAD)
    return str(path)


def reference_parameters(path: str) -> dict[str, torch.Tensor]:
    """Single process, SGD on the full batch: at each step the union of what the two ranks read."""
    wl = load_workload(path)
    torch.manual_seed(0)  # the seed `gpuwise train` uses for the model
    model = wl.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)  # gpuwise's "sgd" (step.py: lr=1e-2)
    ds = wl.build_dataset()
    samplers = [DistributedSampler(ds, WORLD, r, shuffle=True, seed=0, drop_last=True) for r in range(WORLD)]
    loaders = [DataLoader(ds, batch_size=BATCH, sampler=s, drop_last=True) for s in samplers]
    per_epoch = len(loaders[0])
    iters = None
    for step in range(STEPS):
        if step % per_epoch == 0:
            for s in samplers:
                s.set_epoch(step // per_epoch)
            iters = [iter(ld) for ld in loaders]
        parts = [next(it) for it in iters]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        # mean over 2B samples = mean of the two ranks' mean losses: DDP's averaged gradient
        wl.compute_loss(model, (x, y)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_json(capfd, *args: str) -> dict:
    code = cli.main(["train", *args, "--device", "cpu", "--json"])  # CPU ranks (gloo) even on a GPU machine
    out, err = capfd.readouterr()
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out  # exactly one JSON object on stdout
    result = json.loads(lines[0])
    validate("train", result)
    return result


def assert_same_parameters(ckpt_dir: str, expected: dict[str, torch.Tensor]) -> None:
    ckpt = checkpoint.load(ckpt_dir)
    assert ckpt is not None and ckpt.step == STEPS
    assert set(ckpt.model) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(ckpt.model[name], value, rtol=1e-5, atol=1e-6)


def test_two_cpu_ranks_match_full_batch_training(workload_file, tmp_path, capfd):
    ckpt_dir = str(tmp_path / "ckpt")
    result = train_json(capfd, workload_file, "-n", str(WORLD), "--steps", str(STEPS), "-b", str(BATCH),
                        "--optimizer", "sgd", "--checkpoint-dir", ckpt_dir)
    # docs/contracts.md contract
    for key in ("world_size", "backend", "steps", "samples_per_s", "final_loss", "checkpoint"):
        assert key in result
    assert (result["world_size"], result["backend"], result["steps"]) == (2, "gloo", STEPS)
    assert result["samples_per_s"] > 0 and result["final_loss"] > 0
    assert result["checkpoint"] == checkpoint.checkpoint_path(ckpt_dir)
    assert result["data"] == "dataset" and result["restarts"] == 0
    expected = reference_parameters(workload_file)
    assert_same_parameters(ckpt_dir, expected)
    # and training did move the parameters (the comparison is not between two untouched models)
    torch.manual_seed(0)
    initial = load_workload(workload_file).build_model().state_dict()
    assert not torch.allclose(initial["0.weight"], expected["0.weight"])


def test_killed_rank_is_restarted_and_resumes_from_checkpoint(workload_file, tmp_path, capfd, monkeypatch):
    # rank 1 dies (os._exit) when 3 steps are done on the first attempt; checkpoints every 2 steps
    monkeypatch.setenv("GPUWISE_TEST_CRASH_AT_STEP", "3")
    ckpt_dir = str(tmp_path / "ckpt")
    result = train_json(capfd, workload_file, "-n", str(WORLD), "--steps", str(STEPS), "-b", str(BATCH),
                        "--optimizer", "sgd", "--checkpoint-dir", ckpt_dir, "--checkpoint-every", "2",
                        "--max-restarts", "1")
    assert result["restarts"] == 1                         # torchrun restarted the worker group once
    assert result["resumed_from_step"] == 2                # the last checkpoint before the crash
    assert result["steps_this_attempt"] == [3, 4, 5, 6]    # only step 3 was redone, none skipped
    assert_same_parameters(ckpt_dir, reference_parameters(workload_file))


def test_rerun_of_a_finished_job_reports_the_checkpointed_loss(workload_file, tmp_path, capfd):
    ckpt_dir = str(tmp_path / "ckpt")
    args = (workload_file, "-n", "1", "--steps", "2", "-b", str(BATCH), "--checkpoint-dir", ckpt_dir)
    first = train_json(capfd, *args)
    again = train_json(capfd, *args)  # every step is already in the checkpoint: nothing runs
    assert again["resumed_from_step"] == 2 and again["steps_this_attempt"] == []
    assert first["final_loss"] > 0
    assert again["final_loss"] == pytest.approx(first["final_loss"])  # not a made-up 0.0


def test_unusable_checkpoint_dir_is_a_one_line_error_before_training(tmp_path, capfd):
    (tmp_path / "file").write_text("")
    code = cli.main(["train", "examples:mlp", "-n", "1", "--device", "cpu", "--steps", "2",
                     "--checkpoint-dir", str(tmp_path / "file" / "ckpt"), "--json"])
    out, err = capfd.readouterr()
    assert code == 2 and out == "" and "--checkpoint-dir" in err and "torchrun" not in err


def test_checkpoint_is_replaced_atomically(tmp_path):
    folder = str(tmp_path)
    assert checkpoint.load(folder) is None
    for step in (1, 2):
        checkpoint.save(folder, checkpoint.Checkpoint(step=step, epoch=0, model={"w": torch.ones(2) * step},
                                                      optimizer={}, scaler=None, rng=[checkpoint.rng_state()],
                                                      world_size=1, meta={}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temp file left
    ckpt = checkpoint.load(folder)
    assert ckpt.step == 2 and torch.equal(ckpt.model["w"], torch.full((2,), 2.0))
    checkpoint.set_rng_state(ckpt.rng[0])
    a = torch.rand(3)
    checkpoint.set_rng_state(ckpt.rng[0])
    assert torch.equal(torch.rand(3), a)


def test_data_parallel_is_found_explained_and_unwrapped():
    inner = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(torch.nn.DataParallel(inner), torch.nn.ReLU())
    assert find_data_parallel(model) == ["0"]
    message = data_parallel_message(model)
    assert "nn.DataParallel" in message and "GIL" in message and "GPU 0" in message
    assert data_parallel_message(torch.nn.Linear(2, 2)) is None
    plain = unwrap_data_parallel(model)
    assert plain[0] is inner and find_data_parallel(plain) == []
    assert unwrap_data_parallel(torch.nn.DataParallel(inner)) is inner


def test_train_plan_prints_the_sharding_table(capfd):
    code = cli.main(["train", "examples:mlp", "-n", "4", "--optimizer", "adam", "--plan", "--json"])
    out, _ = capfd.readouterr()
    assert code == 0
    plan = json.loads(out)
    # mlp: Linear(32, 16) = 32*16 + 16 = 528 fp32 parameters = 2112 B; Adam state 2 x 2112 B
    assert plan["parameters_bytes"] == 2112 and plan["optimizer_state_bytes"] == 4224
    zero3 = next(r for r in plan["rows"] if r["strategy"] == "zero3/fsdp")
    assert zero3["total_bytes"] == (2112 + 2112 + 4224) // 4
