"""A plain DDP training script as a user writes it (nothing of gpuwise in it), for `torchrun` on gloo.

    torchrun --nproc-per-node 2 ddp_train.py --width 2048 --depth 4 --batch-size 2      # 17M parameters,
        2 samples per rank: the step is the gradient all-reduce (communication-bound)
    torchrun --nproc-per-node 2 ddp_train.py --width 64 --depth 2 --batch-size 4096 --repeat 40
        # 8k parameters, a long forward per sample: the step is compute
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Net(nn.Module):
    def __init__(self, width: int, depth: int, repeat: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.repeat = repeat

    def forward(self, x):
        for _ in range(self.repeat):
            for layer in self.layers:
                x = torch.tanh(layer(x))
        return x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1, help="apply the layers this many times (compute per sample)")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(args.width, args.depth, args.repeat))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(args.batch_size, args.width, generator=g)
    for _ in range(args.steps):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()  # both ranks done before the group goes (gloo: a rank torn down mid-exit can abort)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
