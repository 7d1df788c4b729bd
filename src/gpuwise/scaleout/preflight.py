"""Checks the parent makes before launching ranks: the model's sizes for the DDP memory plan, and
nn.DataParallel inside it. Builds the model once on the CPU."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.memory.ddp import OPTIMIZER_STATE_COPIES, DdpMemoryPlan, model_state_sizes, plan_ddp
from ..workload import Workload
from .dataparallel import data_parallel_message


@dataclass
class Preflight:
    param_sizes_bytes: list[int]
    optimizer: str                 # registry name the state size is counted for
    data_parallel: str | None      # the advice message, when the model contains nn.DataParallel

    @property
    def parameters_bytes(self) -> int:
        return sum(self.param_sizes_bytes)

    def memory_plan(self, world_size: int, gradient_as_bucket_view: bool = False) -> DdpMemoryPlan:
        state = OPTIMIZER_STATE_COPIES.get(self.optimizer, 2) * self.parameters_bytes
        return plan_ddp(self.parameters_bytes, state, world_size, param_sizes_bytes=self.param_sizes_bytes,
                        gradient_as_bucket_view=gradient_as_bucket_view)


def optimizer_key(optimizer) -> str:
    """The OPTIMIZER_STATE_COPIES name of a torch optimizer object (AdamW when unknown)."""
    name = type(optimizer).__name__.lower()
    if name == "sgd":
        momentum = any(g.get("momentum", 0) for g in optimizer.param_groups)
        return "momentum" if momentum else "sgd"
    return name if name in OPTIMIZER_STATE_COPIES else "adamw"


def preflight(workload: Workload, optimizer: str | None) -> Preflight:
    model = workload.build_model()
    message = data_parallel_message(model)
    sizes = model_state_sizes(model)
    if optimizer is None and workload.optimizer_fn is not None:
        optimizer = optimizer_key(workload.optimizer_fn([p for p in model.parameters() if p.requires_grad]))
    return Preflight(sizes, optimizer or "adamw", message)
