"""litgpt finetune lora --quantize bnb.nf4, tiny-llama-1.1b, tiny-llama/qlora.yaml at 00af8b0d (r 32, alpha 16, dropout 0.05, parts query, key, value, projection, mlp, head; bitsandbytes 0.42.0, the release litgpt pins), a full 512-token batch: _litgpt.py."""
from _litgpt import workload

model, batch, loss = workload("tiny-llama-1.1b", "lora", 512, quantize="nf4", bnb_version="0.42.0", lora_r=32, lora_alpha=16,
                              lora_dropout=0.05, lora_query=True, lora_key=True, lora_value=True, lora_projection=True, lora_mlp=True, lora_head=True)
