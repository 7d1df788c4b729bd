"""gpuwise.estimate and `gpuwise estimate`: the JSON contract, the arithmetic of small cases, the CUDA
path (allocator + workspaces + context), the largest batch checked by tracing, and one-line errors."""

from __future__ import annotations

import json
import textwrap

import pytest

import gpuwise
from gpuwise.cli import main
from gpuwise.contracts import SCHEMA_VERSION, validate
from gpuwise.errors import GpuwiseError
from gpuwise.plan import Estimate, estimate
from gpuwise.plan.catalog import CATALOG
from gpuwise.plan.memory.overheads import CONTEXT_BYTES

CONTRACT_KEYS = {"workload", "batch_size", "target", "optimizer", "precision", "method", "peak_allocated_bytes",
                 "peak_reserved_bytes", "device_used_bytes", "by_category", "flops_per_step", "max_batch_size", "gpu"}
CATEGORIES = {"parameters", "gradients", "optimizer_state", "activations", "temporary", "buffers", "inputs"}
MIB = 1024**2

# 4 MiB of input per sample (1024 x 1024 fp32) and a few times that in activations, so that the largest
# batch on a 16 GB T4 is in the hundreds and is settled to one sample
WIDE = """
import torch
def model():
    return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
def batch(n):
    return torch.randn(n, 1024, 1024), torch.randint(0, 10, (n, 1024))
def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
"""

BROKEN = """
import torch
def model():
    return torch.nn.Linear(4, 2)
def batch(n):
    return torch.randn(n, 4)
def loss(model, batch):
    raise ValueError("shapes do not match in my forward")
"""


@pytest.fixture(scope="module")
def mlp_cpu() -> Estimate:
    return estimate("examples:mlp", 4, optimizer="momentum", target="cpu")


@pytest.fixture(scope="module")
def mlp_cuda() -> Estimate:
    return estimate("examples:mlp", 4, optimizer="momentum", target="cuda", gpu="t4", search_max_batch=False)


def test_public_api_resolves_to_the_function():
    assert gpuwise.estimate is estimate and callable(gpuwise.estimate)


def test_cpu_estimate_follows_the_contract_and_the_arithmetic(mlp_cpu):
    d = mlp_cpu.to_dict()
    assert CONTRACT_KEYS <= set(d) and set(d["by_category"]) == CATEGORIES
    assert json.loads(json.dumps(d)) == d                      # plain JSON
    assert d["target"] == "cpu" and d["optimizer"] == "momentum" and d["method"] in ("fake-trace", "real-trace")
    # Linear(32, 16): 32*16 + 16 = 528 floats = 2112 bytes; SGD momentum keeps one buffer per parameter
    assert d["by_category"]["parameters"] == 2112
    assert d["by_category"]["optimizer_state"] == 2112
    assert d["peak_allocated_bytes"] == sum(d["by_category"].values())
    assert d["max_batch_size"] is None and d["gpu"] is None
    # forward 2*4*32*16 = 4096, backward weight grad 4096 (input grad not needed): 8192
    assert d["flops_per_step"] == 8192


def test_cuda_estimate_adds_allocator_rounding_workspaces_and_context(mlp_cuda):
    e = mlp_cuda
    assert e.gpu == CATALOG["t4"].name and e.overheads.arch == "turing"
    # every tensor rounds up to 512 bytes: weight 2048 B -> 2048, bias 64 B -> 512
    assert e.by_category["parameters"] == 2048 + 512
    # T4 (not Hopper): cuBLAS workspace ":4096:2:16:8" = 8 MiB + 128 KiB, one per thread running matmuls
    assert [b for _, b in e.overheads.workspaces] == [8 * MIB + 128 * 1024] * 2
    assert e.peak_reserved_bytes >= e.peak_allocated_bytes >= e.tensor_peak_bytes
    assert e.peak_reserved_bytes % (2 * MIB) == 0              # segments are 2 MiB multiples
    assert e.device_used_bytes == e.peak_reserved_bytes + CONTEXT_BYTES["turing"]
    assert e.fits is True and e.roofline is not None and e.roofline.samples_per_s > 0


def test_a_cuda_estimate_with_convolutions_says_their_workspaces_are_not_in_it(mlp_cuda):
    """cuDNN's per-call convolution workspaces are not modelled: a convnet's estimate says so, an MLP's does not."""
    conv = estimate("examples:lenet", 64, gpu="H200", search_max_batch=False)
    assert any(n.startswith("cuDNN's per-call convolution workspaces are not in this peak") for n in conv.notes)
    assert not any("convolution workspaces" in n for n in mlp_cuda.notes)


def test_largest_batch_on_a_gpu_is_checked_by_tracing_it_and_its_neighbour(tmp_path):
    path = tmp_path / "wide.py"
    path.write_text(textwrap.dedent(WIDE))
    est = estimate(str(path), 8, optimizer="sgd", target="cuda", gpu="t4", margin_pct=5)
    b = est.max_batch_size
    assert est.capacity.settled and 8 < b < 1000
    limit = CATALOG["t4"].memory_bytes * 0.95
    at_b = estimate(str(path), b, optimizer="sgd", gpu="t4", search_max_batch=False)
    above = estimate(str(path), b + 1, optimizer="sgd", gpu="t4", search_max_batch=False)
    assert at_b.device_used_bytes <= limit < above.device_used_bytes
    assert at_b.fits and not above.fits
    d = est.to_dict()
    assert d["curve"]["per_sample_bytes"] > 4 * MIB            # at least the input per sample
    validate("estimate", {"schema_version": SCHEMA_VERSION, **d})  # with a GPU: overheads, roofline, curve


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "positive integer"),
    ({"batch_size": 2, "gpu": "H300"}, "did you mean"),
    ({"batch_size": 2, "gpu": "a100"}, "ambiguous: choose one of a100-40gb, a100-80gb"),
    ({"batch_size": 2, "target": "tpu"}, "unknown target"),
    ({"batch_size": 2, "target": "cpu", "gpu": "h100"}, "--target cuda"),
    ({"batch_size": 2, "optimizer": "lamb"}, "unknown optimizer"),
    ({"batch_size": 2, "precision": "fp8"}, "unknown precision"),
])
def test_bad_input_is_one_clear_error(kwargs, message):
    with pytest.raises(GpuwiseError, match=message):
        estimate("examples:mlp", **kwargs)


def test_a_model_that_raises_in_forward_is_one_line(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text(textwrap.dedent(BROKEN))
    assert main(["estimate", str(path), "-b", "2", "--target", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpuwise estimate: error:") and "shapes do not match" in err[-1]


def test_cli_json_is_one_contract_object(capsys):
    assert main(["estimate", "examples:mlp", "-b", "4", "--target", "cpu", "--optimizer", "sgd", "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    d = json.loads(out)
    assert CONTRACT_KEYS <= set(d) and d["optimizer"] == "sgd" and d["by_category"]["optimizer_state"] == 0
    validate("estimate", d)


def test_cli_table_and_plot(tmp_path, capsys):
    plot = tmp_path / "m.png"
    assert main(["estimate", "examples:mlp", "-b", "4", "--gpu", "l4", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "largest batch" in out and "device used" in out and "fits" in out
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", ["missing-folder/m.png", "m.xyz"])
def test_cli_plot_that_cannot_be_written_is_one_line(tmp_path, capsys, name):
    assert main(["estimate", "examples:mlp", "-b", "4", "--target", "cpu", "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuwise estimate: error: --plot")


@pytest.mark.parametrize("argv", [["--optimizer", "lamb"], ["--precision", "fp8"], ["--target", "tpu"]])
def test_cli_rejects_unknown_choices(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(["estimate", "examples:mlp", "-b", "4", *argv])
    assert info.value.code == 2


def test_gpu_auto_uses_the_freest_visible_gpu_and_its_free_memory(fake_gpus):
    # four_gpus.json: GPU 1 is an A100 80GB with 4 MiB used, the freest
    est = estimate("examples:mlp", 4, optimizer="sgd", gpu="auto", search_max_batch=False)
    assert est.gpu.startswith("NVIDIA A100-SXM4-80GB (GPU 1")
    assert est.gpu_memory_bytes == (81920 - 4) * MIB and est.overheads.arch == "ampere"


def test_gpu_auto_without_gpus_is_one_clear_error(write_fake):
    write_fake([])
    with pytest.raises(GpuwiseError, match="no GPU visible"):
        estimate("examples:mlp", 4, gpu="auto")


def test_cpu_estimate_says_which_onednn_isa_it_assumed():
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "src")}
    out = subprocess.run([sys.executable, "-m", "gpuwise", "estimate", "examples:mlp", "-b", "8", "--target", "cpu", "--json"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0  # cli.run exits at once after estimate (QUICK_EXIT), its output flushed whole
    notes = json.loads(out.stdout)["notes"]
    # AVX2 on any x86 CPU with it (the cap never raises the level); None elsewhere
    assert any(n.startswith("cpu: oneDNN kernels on AVX2 ") or "unknown ISA" in n for n in notes), notes
