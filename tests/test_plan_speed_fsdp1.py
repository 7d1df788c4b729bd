"""FSDP1's kernels around its collectives (plan/speed/fsdp1.py): the byte counts, checked against torch's own
code where it runs on the CPU; no timing."""

import os
import textwrap

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


FSDP1_VIEWS_WORKER = textwrap.dedent("""
    import json, os, socket
    import torch, torch.distributed as dist
    import torch.multiprocessing as mp

    V, D, L, WORLD = 512, 64, 3, 4

    class Block(torch.nn.Module):  # GPT-2's twelve tensors: two norms, qkv, proj, fc, fc proj (weights and biases)
        def __init__(s):
            super().__init__()
            s.ln_1, s.ln_2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
            s.qkv, s.proj = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
            s.fc, s.fc_proj = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)
        def forward(s, x):
            q, k, v = s.qkv(s.ln_1(x)).chunk(3, -1)
            x = x + s.proj(q * k.sigmoid() + v)
            return x + s.fc_proj(torch.nn.functional.gelu(s.fc(s.ln_2(x))))

    class Model(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.wte, s.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(16, D)
            s.blocks = torch.nn.ModuleList([Block() for _ in range(L)])
            s.ln_f = torch.nn.LayerNorm(D)
        def forward(s, idx):
            x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
            for b in s.blocks:
                x = b(x)
            return s.ln_f(x) @ s.wte.weight.t()

    def worker(rank, world, port, q):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        torch.manual_seed(0)
        m = FSDP(Model(), auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True,
                 device_id=torch.device("cpu"))
        x = torch.randint(0, V, (2, 16))
        m(x).logsumexp(-1).sum().backward()
        stepped = sum(p.grad is not None for p in m.parameters())  # what a for-loop optimizer steps here
        q.put((rank, stepped))
        dist.destroy_process_group()

    if __name__ == "__main__":
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        ctx = mp.get_context("spawn"); q = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, WORLD, port, q)) for r in range(WORLD)]
        for p in procs: p.start()
        got = dict(q.get(timeout=240) for _ in procs)
        for p in procs: p.join()
        print(json.dumps({"stepped": [got[r] for r in range(WORLD)], "tensors": 2 + 12 * L + 2, "units": L + 1}))
""")


def test_fsdp1_ranks_step_only_the_views_in_their_piece_as_real_fsdp1(json_script):
    """FSDP1 with use_orig_params=True on 4 gloo ranks: a rank's parameters whose data lies outside its piece of
    the flat parameter have no gradient, so a one-tensor-at-a-time optimizer steps only the others.
    `views_stepped` is their average over the ranks."""
    from gpuwise.plan.speed.fsdp_kernels import views_stepped

    got = json_script(FSDP1_VIEWS_WORKER, "fsdp1_views.py")
    mean = sum(got["stepped"]) / len(got["stepped"])
    assert max(got["stepped"]) < got["tensors"] / 2  # far fewer than the model's 40 tensors on every rank (measured: 16, 16, 10, 10)
    assert mean == pytest.approx(views_stepped(got["tensors"], got["units"], 4), rel=0.05), got


def test_fsdp1_one_tensor_at_a_time_optimizer_launches_per_view_stepped():
    """An optimizer with a kernel per tensor or more (torch's foreach=False, Composer's DecoupledAdamW) launches
    and dispatches per view the FSDP1 rank steps; under FSDP2 every rank steps a shard of every tensor, and a
    multi-tensor optimizer launches per list: both kept."""
    from collections import Counter

    from gpuwise.plan.memory.split import Split
    from gpuwise.plan.speed.fsdp_kernels import views_stepped, with_fsdp_kernels
    from gpuwise.plan.speed.ops import OpCosts

    def costs(optimizer_kernels: int) -> OpCosts:
        c = OpCosts()
        c.kernels = Counter({"forward": 100, "backward": 200, "optimizer": optimizer_kernels})
        c.host_ops = Counter({"forward": 300, "backward": 600, "optimizer": optimizer_kernels + 148, "zero_grad": 3})
        return c

    args = (1e8, "bf16", 1, 12)  # grad bytes, precision, micro-steps, blocks: 13 units
    fsdp1_split, fsdp2_split = Split("fsdp", 8, flat_params=True), Split("fsdp", 8)
    loop = with_fsdp_kernels(costs(9 * 148), fsdp1_split, *args, tensors=148)
    share = views_stepped(148, 13, 8) / 148
    assert share == pytest.approx((13 + 135 / 8) / 148)
    assert loop.host_ops["optimizer"] == pytest.approx(10 * 148 * share)
    assert loop.host_ops["zero_grad"] == pytest.approx(3 * share)
    plain = with_fsdp_kernels(costs(9 * 148), fsdp1_split, *args)  # tensors not known: kept
    assert loop.kernels["optimizer"] == pytest.approx(plain.kernels["optimizer"] - 9 * 148 * (1 - share))
    assert loop.kernels["forward"] == plain.kernels["forward"] and loop.host_ops["backward"] == 600
    assert with_fsdp_kernels(costs(9 * 148), fsdp2_split, *args, tensors=148).host_ops["optimizer"] == 10 * 148
    assert with_fsdp_kernels(costs(40), fsdp1_split, *args, tensors=148).host_ops["optimizer"] == 40 + 148
    assert views_stepped(3, 13, 8) == 3  # fewer tensors than units: each its own
