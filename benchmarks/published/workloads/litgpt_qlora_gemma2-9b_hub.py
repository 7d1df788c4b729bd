"""litgpt finetune lora --quantize bnb.nf4, gemma-2-9b, gemma2-9b/qlora.yaml at 00af8b0d (r 16, alpha 16, dropout 0.1, parts query, key, value, projection, mlp, head; bitsandbytes 0.42.0, the release litgpt pins), a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("gemma-2-9b", "lora", 512, quantize="nf4", bnb_version="0.42.0",
                              lora_r=16, lora_alpha=16, lora_dropout=0.1,
                              lora_query=True, lora_key=True, lora_value=True, lora_projection=True, lora_mlp=True, lora_head=True)
