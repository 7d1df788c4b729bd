"""litgpt finetune adapter, Llama-2-7b-hf, bf16-true, the longest Alpaca sample (1304 tokens): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("Llama-2-7b-hf", "adapter", 1304)
