"""litgpt finetune adapter_v2, stablelm-base-alpha-3b, bf16-true, the longest Alpaca sample (1034 tokens): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("stablelm-base-alpha-3b", "adapter_v2", 1034)
