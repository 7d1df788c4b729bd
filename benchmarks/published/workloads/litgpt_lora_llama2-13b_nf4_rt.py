"""litgpt finetune/lora.py at 8641822 (the resource tables' commit), Llama-2-13b-hf: its module defaults r 8, alpha 16,
dropout 0.05, LoRA on query and value only; --quantize bnb.nf4 (Fabric's
BitsandbytesPrecision, bitsandbytes 0.41.1, the tables' release); the longest Alpaca sample (1304 tokens, the first iteration's
batch): _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("Llama-2-13b-hf", "lora", 1304, package="lit_gpt", quantize="nf4", bnb_version="0.41.1",
                              r=8, alpha=16, dropout=0.05,
                              to_query=True, to_key=False, to_value=True, to_projection=False,
                              to_mlp=False, to_head=False)
