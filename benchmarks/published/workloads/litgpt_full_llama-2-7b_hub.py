"""litgpt finetune full, Llama-2-7b-hf, llama-2-7b/full.yaml at 00af8b0d, a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("Llama-2-7b-hf", "full", 512)
