#!/usr/bin/env python3
"""Loads a checkpoint of examples/char_gpt into the equivalent PyTorch module and samples from it:
    python3 examples/char_gpt_load.py run.safetensors [prompt]
Needs PyTorch 2.x and the safetensors package. The checkpoint also holds the optimizer's state
(keys "optimizer.*"), hence strict=False; every model key must be present."""
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_pytorch import GPT  # noqa: E402


def main():
    path = sys.argv[1]
    prompt = sys.argv[2] if len(sys.argv) > 2 else "\n"
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    user = {k[len("user."):]: v for k, v in meta.items() if k.startswith("user.")}
    vocab = bytes.fromhex(user["gpt.vocab_hex"])
    model = GPT(*(int(user["gpt." + k]) for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")))
    result = model.load_state_dict(load_file(path), strict=False)
    assert not result.missing_keys, f"missing: {result.missing_keys}"
    print(f"loaded {path} (step {user['step']}): {sum(p.numel() for p in model.parameters())} parameters")
    ids = [vocab.index(c) for c in prompt.encode() if c in vocab] or [0]
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(200):
            logits = model(torch.tensor([ids[-model.transformer.wpe.num_embeddings:]]))[0, -1]
            logits[len(vocab):] = float("-inf")  # classes padded past the text's (--vocab) have no byte
            ids.append(torch.multinomial(torch.softmax(logits, -1), 1).item())
    print(bytes(vocab[i] for i in ids).decode(errors="replace"))


if __name__ == "__main__":
    main()
