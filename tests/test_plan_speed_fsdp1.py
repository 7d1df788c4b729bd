"""FSDP1's kernels around its collectives (plan/speed/fsdp1.py): the byte counts, checked against torch's own
code where it runs on the CPU; no timing."""

import os

import pytest
import torch

from gpuwise.errors import GpuwiseError
from gpuwise.plan import estimate
from gpuwise.plan.memory.split import make_split
from gpuwise.plan.speed import fsdp1

CONFIGS = os.path.join(os.path.dirname(__file__), "data", "configs")
TINY = os.path.join(CONFIGS, "tiny-llama.json")


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 8, 16, 24, 32, 64, 96, 128, 256, 512])
def test_predivide_factor_is_torchs(world):
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    assert fsdp1.predivide_factor(world) == DefaultState._get_gradient_predivide_factor(world)


def test_composer_default_bytes_per_micro_batch():
    # MixedPrecision(param_dtype=bf16, reduce_dtype=fp32) over 8 ranks, FULL_SHARD, E = 8e9 elements, shard 1e9:
    # forward: the fp32 shard cast to bf16 (4 + 2) x 1e9; backward: that cast again, the cat of the bf16 flat
    # gradient (2 x 2 x 8e9), its cast to fp32 (2 + 4) x 8e9 (unrolled: a cast up), pre-divide by 4 in place
    # (2 x 4 x 8e9), post-divide by 2 on the fp32 shard (2 x 4 x 1e9), += into the kept shard (3 x 4 x 1e9)
    e = 8e9
    got = fsdp1.kernel_bytes(e, 8, 2, "bf16", "fp32", accumulate=True)
    assert got == {("forward", "vectorized"): 6e9,
                   ("backward", "vectorized"): 6e9 + 32e9 + 64e9 + 8e9 + 12e9,
                   ("backward", "unrolled"): 48e9}
    first = fsdp1.kernel_bytes(e, 8, 2, "bf16", "fp32")  # the first micro-batch of a step: nothing to add to
    assert first[("backward", "vectorized")] == got[("backward", "vectorized")] - 12e9


def test_composer_pure_reduces_in_bf16_and_casts_the_shard_back():
    # PURE: reduce_dtype bf16: no cast of the unsharded gradient; divisions in bf16; the bf16 output shard cast
    # to the fp32 parameter's dtype (_cast_grad_to_param_dtype), unrolled
    got = fsdp1.kernel_bytes(8e9, 8, 2, "bf16", "bf16")
    assert got[("backward", "vectorized")] == 6e9 + 32e9 + 2 * 2 * 8e9 + 2 * 2 * 1e9
    assert got[("backward", "unrolled")] == (2 + 4) * 1e9


def test_no_sync_micro_batch_only_builds_the_flat_gradient():
    got = fsdp1.kernel_bytes(8e9, 8, 2, "bf16", "fp32", reduce=False)
    assert got == {("forward", "vectorized"): 6e9, ("backward", "vectorized"): 6e9 + 32e9}
    assert fsdp1.kernels_per_unit("bf16", "fp32", 8, reduce=False) == {"forward": 1, "backward": 2}
    # reduce: + cast up, pre-divide, post-divide (8 / 4 = 2), accumulation
    assert fsdp1.kernels_per_unit("bf16", "fp32", 8, accumulate=True) == {"forward": 1, "backward": 6}


def test_the_flat_gradient_is_a_cat_of_the_views_gradients():
    # FSDP1's unit parameters are views of one flat parameter (_use_unsharded_views: split, then view), so the
    # flat gradient comes from split_with_sizes' backward: one cat writing every element of the flat parameter
    from torch.utils._python_dispatch import TorchDispatchMode

    flat = torch.zeros(3 * 4 + 4 + 5, requires_grad=True)
    w, b, unused = torch.split(flat, [12, 4, 5])
    x = torch.randn(2, 4)
    loss = (x @ w.view(3, 4).t()).sum() + b.sum()
    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen.append((str(func.overloadpacket), tuple(getattr(out, "shape", ()))))
            return out

    with Log():
        loss.backward()
    assert ("aten.cat", (21,)) in seen
    assert flat.grad.shape == (21,)


def test_fsdp1_mixed_precision_prices_its_kernels_into_the_step():
    kw = dict(seq_len=32, nproc=8, gpu="H100", target="cuda", fsdp_param_dtype="bf16", search_max_batch=False,
              grad_accum=2, accum_sync="every")
    two, one = estimate(TINY, 2, strategy="fsdp", **kw), estimate(TINY, 2, strategy="fsdp1", **kw)
    assert one.strategy == "fsdp1"
    assert any(n.startswith("FSDP1 MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)") for n in one.notes)
    extra = one.speed.breakdown["memory_bound"] - two.speed.breakdown["memory_bound"]
    assert extra > 0
    assert one.speed.breakdown["matmul"] == two.speed.breakdown["matmul"]
    with pytest.raises(GpuwiseError, match="MixedPrecision"):
        make_split(8, "zero2", param_dtype="bf16")
