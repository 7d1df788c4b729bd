"""litgpt finetune full, gemma-2b, gemma-2b/full.yaml at 00af8b0d, a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("gemma-2b", "full", 512)
