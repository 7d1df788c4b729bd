"""litgpt finetune full, tiny-llama-1.1b, tiny-llama/full.yaml at 00af8b0d, a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("tiny-llama-1.1b", "full", 512)
