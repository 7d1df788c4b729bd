"""litgpt finetune adapter, Llama-2-7b-hf, --quantize bnb.nf4-dq (bitsandbytes 0.41.1, the tables' release), the longest Alpaca sample (1304 tokens): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("Llama-2-7b-hf", "adapter", 1304, quantize="nf4-dq", bnb_version="0.41.1")
