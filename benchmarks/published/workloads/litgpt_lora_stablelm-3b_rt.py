"""litgpt finetune/lora.py at 8641822 (the resource tables' commit), stablelm-base-alpha-3b: its module defaults r 8, alpha 16,
dropout 0.05, LoRA on query and value only; the longest Alpaca sample (1034 tokens, the first iteration's
batch): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("stablelm-base-alpha-3b", "lora", 1034, package="lit_gpt", r=8, alpha=16, dropout=0.05,
                              to_query=True, to_key=False, to_value=True, to_projection=False,
                              to_mlp=False, to_head=False)
