"""litgpt finetune adapter_v2, Llama-2-7b-hf, bf16-true, the longest Alpaca sample (1304 tokens): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("Llama-2-7b-hf", "adapter_v2", 1304)
