"""litgpt finetune full, stablelm-base-alpha-3b, stablelm-base-alpha-3b/full.yaml at 00af8b0d, a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("stablelm-base-alpha-3b", "full", 512)
