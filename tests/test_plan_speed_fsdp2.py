"""FSDP2's kernels around its collectives (plan/speed/fsdp2.py): the bytes each copy moves, checked against real
`fully_shard` on 2 gloo CPU ranks, whose ops a dispatch mode logs with their tensors; no timing."""

import textwrap

import pytest

from gpuwise.plan import estimate
from gpuwise.plan.speed import fsdp2

WIDTH, HIDDEN, BLOCKS, BATCH = 64, 256, 3, 8
ELEMENTS = BLOCKS * (WIDTH * HIDDEN + HIDDEN + HIDDEN * WIDTH + WIDTH)

# rank 0's bytes (tensors read + written) of FSDP's own copies in one forward and one backward, per MixedPrecision
# setting: (param_dtype, reduce_dtype, whether the sharded gradients of an earlier backward are kept)
WORKER = textwrap.dedent(f"""
    import json, os, socket, sys
    import torch, torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils._python_dispatch import TorchDispatchMode

    def nbytes(t):
        if isinstance(t, torch.Tensor):
            return t.numel() * t.element_size()
        if isinstance(t, (list, tuple)):
            return sum(nbytes(x) for x in t)
        return 0

    class Copies(TorchDispatchMode):
        # FSDP's copy-in / copy-out / reduce-scatter copy-in (their inputs and `out`), the accumulation into a kept
        # sharded gradient, and a cast of a reduce-scatter output (gloo's own splits and copies are not FSDP's)
        def __init__(self):
            super().__init__()
            self.bytes = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {{}}
            out = func(*args, **kwargs)
            name = str(func.overloadpacket)
            if name in ("fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy", "fsdp.chunk_cat"):
                self.bytes += nbytes(args[:2] if name == "fsdp.all_gather_copy_in" else args[:1]) + nbytes(kwargs.get("out"))
            elif name == "aten.add_" and args[0].dim() >= 1 and args[0].dtype == torch.float32:
                self.bytes += 2 * nbytes(args[0]) + nbytes(args[1])
            elif name == "aten._to_copy" and args[0].dtype == torch.bfloat16 and out.dtype == torch.float32:
                self.bytes += nbytes(args[0]) + nbytes(out)
            return out

    def worker(rank, world, port, q, reduce_dtype, keep):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear({WIDTH}, {HIDDEN}), torch.nn.ReLU(),
                                      torch.nn.Linear({HIDDEN}, {WIDTH})) for _ in range({BLOCKS})])
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, reduce_dtype))
        for block in model:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        x = torch.randn({BATCH}, {WIDTH})
        model(x).pow(2).mean().backward()  # warm-up; its sharded gradients kept or dropped
        if not keep:
            for p in model.parameters():
                p.grad = None
        fwd, bwd = Copies(), Copies()
        with fwd:
            loss = model(x).pow(2).mean()
        with bwd:
            loss.backward()
        q.put((rank, [fwd.bytes, bwd.bytes]))
        dist.destroy_process_group()

    if __name__ == "__main__":
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        ctx = mp.get_context("spawn"); q = ctx.Queue()
        out = {{}}
        for reduce_dtype, keep in (("float32", False), ("bfloat16", True)):
            procs = [ctx.Process(target=worker, args=(r, 2, port, q, reduce_dtype, keep)) for r in range(2)]
            for p in procs: p.start()
            got = dict(q.get(timeout=240) for _ in procs)
            for p in procs: p.join()
            out[reduce_dtype] = got[0]
            s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        print(json.dumps(out))
""")


def test_fsdp2_copies_are_what_real_fully_shard_moves(json_script):
    real = json_script(WORKER, "fsdp2_copies.py")
    # bf16 parameters, fp32 reduce, no kept gradient: forward = copy-in (fp32 shard read, bf16 written) + copy-out
    # (bf16, every element read and written); backward = that again + chunk_cat (bf16 read, fp32 written)
    plain = fsdp2.kernel_bytes(ELEMENTS, 2, 2, 4, "bf16", "fp32")
    assert real["float32"] == [plain["forward"], plain["backward"]]
    # bf16 reduce into kept fp32 sharded gradients: + the output shard cast up and the accumulation
    kept = fsdp2.kernel_bytes(ELEMENTS, 2, 2, 4, "bf16", "bf16", accumulate=True)
    assert real["bfloat16"] == [kept["forward"], kept["backward"]]
    shard = ELEMENTS / 2
    assert kept["backward"] - plain["backward"] == -2 * ELEMENTS + (2 + 4) * shard + 12 * shard


def test_bytes_by_setting():
    e, shard = 8e9, 1e9  # 8 ranks
    # torchtitan's MixedPrecisionPolicy(bf16, fp32), reshard after forward: forward (4 + 2) S + 2 x 2 E
    got = fsdp2.kernel_bytes(e, 8, 2, 4, "bf16", "fp32")
    assert got == {"forward": 6 * shard + 4 * e, "backward": 6 * shard + 4 * e + 6 * e}
    # no reshard after forward: backward gathers nothing
    assert fsdp2.kernel_bytes(e, 8, 2, 4, "bf16", "fp32", reshard_after_forward=False)["backward"] == 6 * e
    # a micro-batch under set_requires_gradient_sync(False): only the all-gathers
    assert fsdp2.kernel_bytes(e, 8, 2, 4, "bf16", "fp32", reduce=False) == {"forward": 6 * shard + 4 * e,
                                                                          "backward": 6 * shard + 4 * e}
    # no mixed precision, fp32: 8 S + 8 E per all-gather, 8 E for chunk_cat
    assert fsdp2.kernel_bytes(e, 8, 4, 4) == {"forward": 8 * shard + 8 * e, "backward": 8 * shard + 16 * e}
    # fp16 reduce: + pre-divide of the input, post-divide of the output, the output cast up
    fp16 = fsdp2.kernel_bytes(e, 8, 2, 4, "fp16", "fp16")
    assert fp16["backward"] == 6 * shard + 4 * e + 4 * e + (4 * e + 4 * shard) + 6 * shard
    assert fsdp2.kernels_per_unit("bf16", "fp32") == {"forward": 2, "backward": 3}
    assert fsdp2.kernels_per_unit("bf16", "bf16", accumulate=True, grad_itemsize=2) == {"forward": 2, "backward": 5}


def test_fsdp2_copies_are_priced_into_the_step():
    import os

    import torch
    import transformers

    from gpuwise.plan.catalog import lookup, speed_spec
    from gpuwise.plan.speed.memory_bound import memory_bound_s

    tiny = os.path.join(os.path.dirname(__file__), "data", "configs", "tiny-llama.json")
    with torch.device("meta"):
        elements = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(tiny)).parameters())
    kw = dict(seq_len=32, nproc=8, gpu="H100", target="cuda", precision="bf16-pure", search_max_batch=False)
    fsdp, zero2 = estimate(tiny, 2, strategy="fsdp", **kw), estimate(tiny, 2, strategy="zero2", **kw)
    # the same traced ops; FSDP2 adds its copies (bf16 shards, gradients reduced in bf16), ZeRO-2 none
    spec = lookup("H100")
    added = sum(fsdp2.kernel_bytes(elements, 8, 2, 2).values())
    extra = fsdp.speed.breakdown["memory_bound"] - zero2.speed.breakdown["memory_bound"]
    assert extra == pytest.approx(memory_bound_s(added, spec.bandwidth_bytes_per_s, speed_spec(spec).memory_efficiency,
                                                 "vectorized"), rel=1e-6)
    assert fsdp.speed.breakdown["matmul"] == zero2.speed.breakdown["matmul"]
