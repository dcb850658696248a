"""Two turns of a chat on the same bounded cache: the second generate continues it.

    python examples/chat.py
"""

import torch

from scissorhands.hf import EvictingCache, load_model

torch.set_num_threads(1)
model, tokenizer = load_model(progress=False)  # sdpa attention, as transformers loads by default
cache = EvictingCache.from_model(model, "recommended", budget=96)

messages = [{"role": "user", "content": "Name a planet of the solar system."}]
for follow_up in ("Name another one.", None):
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    out = model.generate(**inputs, cache=cache, max_new_tokens=40, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    print("user:", messages[-1]["content"])
    print("assistant:", answer)
    messages.append({"role": "assistant", "content": answer})
    if follow_up:
        messages.append({"role": "user", "content": follow_up})
print(f"{cache.get_seq_length()} tokens seen, at most {cache.held_counts().max()} held per layer and KV head")
