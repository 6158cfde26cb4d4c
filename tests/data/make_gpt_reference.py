#!/usr/bin/env python3
"""Writes tests/data/gpt_reference.safetensors: a fixed-weight 2-layer GPT (examples/gpt_pytorch.py,
the architecture of examples/gpt.h under nanoGPT's names) run once in PyTorch in float64: its weights, a batch of ids
and targets, the logits, the cross-entropy loss and every parameter's gradient. //tests:gpt_test
checks ampgrad against it; the tests never need PyTorch.

Run with any Python that has PyTorch 2.x:  python3 tests/data/make_gpt_reference.py
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from gpt_pytorch import GPT  # noqa: E402  (the same model char_gpt's checkpoints load into)

VOCAB, BLOCK, LAYERS, HEADS, EMBD = 11, 8, 2, 2, 16
BATCH, T = 2, 6


def save_safetensors(path, tensors):
    """The safetensors format with the standard library: u64 header length, JSON header, bytes."""
    names = {torch.float64: "F64", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    torch.manual_seed(0)
    model = GPT(VOCAB, BLOCK, LAYERS, HEADS, EMBD).double()
    # Weights of a trained model's size: N(0, 0.3) everywhere (norm scales around 1), so every
    # path carries a signal the comparison can see.
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0))
    ids = torch.randint(0, VOCAB, (BATCH, T))
    targets = torch.randint(0, VOCAB, (BATCH * T,))
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets)
    loss.backward()
    tensors = {name: p for name, p in model.state_dict().items()}
    tensors.update({"input.ids": ids, "input.targets": targets, "output.logits": logits, "output.loss": loss.reshape(1)})
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_reference.safetensors")
    save_safetensors(out, tensors)
    print(f"wrote {out}: loss {loss.item():.6f}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
