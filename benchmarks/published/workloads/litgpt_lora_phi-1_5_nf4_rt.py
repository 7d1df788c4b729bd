"""litgpt finetune/lora.py at 8641822 (the resource tables' commit), phi-1_5: its module defaults r 8, alpha 16,
dropout 0.05, LoRA on query and value only; --quantize bnb.nf4 (Fabric's
BitsandbytesPrecision, bitsandbytes 0.41.1, the tables' release); the longest Alpaca sample (1044 tokens, the first iteration's
batch): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("phi-1_5", "lora", 1044, package="lit_gpt", quantize="nf4", bnb_version="0.41.1",
                              r=8, alpha=16, dropout=0.05,
                              to_query=True, to_key=False, to_value=True, to_projection=False,
                              to_mlp=False, to_head=False)
