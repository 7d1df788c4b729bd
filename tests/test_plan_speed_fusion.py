"""--compile: what a fusing compiler leaves of the forward's and backward's memory-bound ops (plan/speed/fusion.py),
from the region accounting on real tensors up to an estimate of a real architecture."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gpuwise.cli import main
from gpuwise.contract import Workload
from gpuwise.plan import estimate
from gpuwise.plan.speed.fusion import block_of
from gpuwise.plan.speed.ops import OpCosts

MB = 2**20


def _record(c: OpCosts, name: str, phase: str, args: tuple, out, module: str, flops: int = 0) -> None:
    c.record(name, phase, args, {}, out, flops, None, module)


def test_a_region_reads_what_it_takes_once_and_writes_only_what_outlives_it():
    c = OpCosts()
    x = torch.randn(256, 1024)               # 1 MiB
    w = torch.randn(1024, 1024)
    y = x * 2
    _record(c, "aten.mul", "forward", (x, 2), y, "model.layers.0.mlp")
    z = y + x                                 # x again: read once by the region
    _record(c, "aten.add", "forward", (y, x), z, "model.layers.0.mlp")
    del y                                     # dead inside the region: never written
    o = z @ w                                 # a GEMM ends the region: z is alive, so written once
    _record(c, "aten.mm", "forward", (z, w), o, "model.layers.0.mlp", flops=2 * 256 * 1024 * 1024)
    assert c.memory_bytes["forward"] == 5 * MB                   # eager: x read, y written; y, x read, z written
    assert c.fused_bytes["forward"] == 2 * MB                    # fused: x read, z written
    assert (c.memory_kernels["forward"], c.fused_kernels["forward"]) == (2, 1)
    r = torch.relu(o)                          # the next region: reads the GEMM's output
    _record(c, "aten.relu", "forward", (o,), r, "model.layers.0.mlp")
    s = r * 3                                  # another block: a region of its own (per-block compilation)
    _record(c, "aten.mul", "forward", (r, 3), s, "model.layers.1.mlp")
    assert c.fused_bytes["forward"] == 2 * MB + 3 * MB            # o read; r alive at the block's end: written,
    # and read again by the next block's region
    assert c.fused_kernels["forward"] == 3
    g = s * 0.5                                # the backward: the forward's last region ends, s written
    _record(c, "aten.mul", "backward", (s, 0.5), g, "model.layers.1.mlp")
    assert c.fused_bytes["forward"] == 6 * MB and c.fused_bytes["backward"] == 1 * MB


def test_the_optimizer_is_not_fused_and_its_ops_end_the_region():
    c = OpCosts()
    p, grad = torch.randn(256, 1024), torch.randn(256, 1024)
    a = grad * 2
    _record(c, "aten.mul", "backward", (grad, 2), a, "model.layers.0")
    b = p - a                                  # an optimizer op: eager, and the backward's region ends there
    _record(c, "aten.sub", "optimizer", (p, a), b, "")
    assert c.fused_bytes["backward"] == 2 * MB and "optimizer" not in c.fused_bytes
    assert c.memory_bytes["optimizer"] == 3 * MB and c.memory_kernels["optimizer"] == 0


def test_compiled_prices_the_fused_bytes_and_kernels_of_the_forward_and_backward_only():
    c = OpCosts(memory_bytes=Counter({"forward": 10, ("forward", "strided"): 5, "optimizer": 7}),
                kernels=Counter({"forward": 10, "optimizer": 3}), host_ops=Counter({"forward": 30, "optimizer": 9}),
                fused_bytes=Counter({"forward": 4}), fused_kernels=Counter({"forward": 2}),
                memory_kernels=Counter({"forward": 8}))
    out = c.compiled()
    assert dict(out.memory_bytes) == {"forward": 4, "optimizer": 7}
    assert (out.kernels["forward"], out.kernels["optimizer"]) == (4, 3)        # 10 - 8 eager + 2 fused
    assert (out.host_ops["forward"], out.host_ops["optimizer"]) == (4, 9)      # the wrapper launches its kernels


def test_block_of_is_the_numbered_module_list_entry():
    assert block_of("base_model.model.model.layers.3.mlp.lora_A.default") == "base_model.model.model.layers.3"
    assert block_of("encoder.block.0.layer.1") == "encoder.block.0"
    assert block_of("lm_head") == block_of("") == ""


def test_estimate_compile_fuses_a_deep_models_memory_bound_ops_and_keeps_its_memory():
    """Llama-3.2-1B (16 blocks: rebuilt from 3 and 4 traced) on an H100: the same GEMMs and attention, fewer
    memory-bound bytes and kernels, the same memory; the same answer traced again."""
    kw = dict(precision="bf16", gpu="h100", search_max_batch=False, seq_len=512)
    eager = estimate("examples/configs/llama-3.2-1b.json", 2, **kw)
    fused = estimate("examples/configs/llama-3.2-1b.json", 2, compile=True, **kw)
    again = estimate("examples/configs/llama-3.2-1b.json", 2, compile=True, **kw)
    e, f = eager.speed.breakdown, fused.speed.breakdown
    assert f["matmul"] == e["matmul"] and f["attention"] == e["attention"]
    assert 0 < f["memory_bound"] < 0.7 * e["memory_bound"]
    assert fused.speed.step_time_s < eager.speed.step_time_s
    assert fused.device_used_bytes == eager.device_used_bytes
    assert any(n.startswith("torch.compile:") for n in fused.notes)
    assert again.speed.step_time_s == fused.speed.step_time_s


def test_cli_compile_with_inference_is_one_line_error(capsys):
    assert main(["estimate", "examples:mlp", "-b", "4", "--inference", "--compile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compile" in err[0]



def test_a_workload_whose_model_is_compiled_is_priced_fused_without_the_flag():
    """The user's own code first: a model run through torch.compile in the workload is priced as --compile prices."""
    def model(compiled: bool):
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.LayerNorm(4096),
                                torch.nn.Linear(4096, 1024), torch.nn.Dropout(0.1))
        if compiled:
            m.compile()
        return m

    def batch(n: int):
        return torch.randn(n, 1024)

    def workload(compiled: bool) -> Workload:
        return Workload("mlp", lambda: model(compiled), batch, lambda m, x: m(x).float().pow(2).mean())

    kw = dict(precision="bf16", gpu="h100", search_max_batch=False)
    plain = estimate(workload(False), 64, **kw)
    flagged = estimate(workload(False), 64, compile=True, **kw)
    compiled = estimate(workload(True), 64, **kw)
    assert not any(n.startswith("torch.compile:") for n in plain.notes)
    assert any(n.startswith("torch.compile:") for n in compiled.notes)
    assert compiled.speed.breakdown["memory_bound"] == flagged.speed.breakdown["memory_bound"] \
        < plain.speed.breakdown["memory_bound"]


def test_fit_compile_ranks_by_the_fused_speed_and_its_estimate_cmd_says_so(tmp_path, capsys):
    """fit --compile: every option's speed as estimate --compile prices it (the same memory), and each option's
    estimate_cmd carries --compile."""
    import json
    import shlex

    from gpuwise.plan.fit import fit

    source = tmp_path / "tiny6.json"
    source.write_text(json.dumps({**json.load(open("tests/data/configs/tiny-llama.json")), "num_hidden_layers": 6}))
    eager = fit(str(source), "rtx4090", 1, 2, seq_len=64, precision="bf16")
    fused = fit(str(source), "rtx4090", 1, 2, seq_len=64, precision="bf16", compile=True)
    by_name = {o.name: o for o in eager.options}
    sized = [o for o in fused.options if o.fits]
    assert sized
    for o in sized:
        assert o.device_used_bytes == by_name[o.name].device_used_bytes
        assert o.samples_per_s > by_name[o.name].samples_per_s
        assert "--compile" in shlex.split(o.estimate_cmd) and "--compile" not in by_name[o.name].estimate_cmd
    top = sized[0]
    capsys.readouterr()
    assert main([*shlex.split(top.estimate_cmd)[1:], "--json"]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    assert speed["samples_per_s"] == pytest.approx(top.samples_per_s, rel=1e-6)
