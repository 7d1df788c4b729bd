"""litgpt finetune adapter, stablelm-base-alpha-3b, bf16-true, the longest Alpaca sample (1034 tokens): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("stablelm-base-alpha-3b", "adapter", 1034)
