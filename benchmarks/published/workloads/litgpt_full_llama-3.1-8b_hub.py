"""litgpt finetune full, Meta-Llama-3.1-8B, llama-3.1-8b/full.yaml at 00af8b0d, a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("Meta-Llama-3.1-8B", "full", 512)
