"""litgpt finetune full, phi-2, phi-2/full.yaml at 00af8b0d, a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("phi-2", "full", 512)
