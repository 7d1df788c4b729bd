"""litgpt finetune adapter_v2, stablelm-base-alpha-3b, --quantize bnb.nf4 (bitsandbytes 0.41.1, the tables' release), the longest Alpaca sample (1034 tokens): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("stablelm-base-alpha-3b", "adapter_v2", 1034, quantize="nf4", bnb_version="0.41.1")
