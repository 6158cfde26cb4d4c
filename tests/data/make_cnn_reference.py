#!/usr/bin/env python3
"""Writes the PyTorch reference of //tests:conv_test (run once; the outputs are committed).

A small CNN with every convolutional layer ampgrad has, under torch.manual_seed(0):
  nn.Sequential(Conv2d(1, 4, 3, padding=1), BatchNorm2d(4), ReLU(), MaxPool2d(2),
                Conv2d(4, 6, 3, stride=1, padding=1, groups=2, bias=False), BatchNorm2d(6), ReLU(),
                AvgPool2d(2), Conv2d(6, 8, 1), AdaptiveAvgPool2d(1), Flatten(), Linear(8, 10))
on a fixed batch x [5, 1, 12, 12] with labels. In float64 (the weights and inputs are float32
values; results stored as float32), training mode: forward, cross_entropy, backward; then the
running statistics the forward updated; then eval mode's logits with those statistics.
Outputs, in OUT_DIR (default: this script's folder):
  cnn_reference_model.safetensors  the initial state_dict (weights and BatchNorm buffers, PyTorch's names)
  cnn_reference.safetensors        x, target, logits, loss, grad.<param>, after.<buffer>, eval_logits
Usage: PYTHON tests/data/make_cnn_reference.py [OUT_DIR], where PYTHON has torch 2.x and safetensors.
"""
import os
import sys

import torch
from safetensors.torch import save_file

nn = torch.nn


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, stride=1, padding=1, groups=2, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
        nn.AvgPool2d(2), nn.Conv2d(6, 8, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    model = make_model()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 1, 12, 12, generator=gen) * 2 + 0.5
    target = torch.tensor([3, 1, 4, 1, 5], dtype=torch.int64)

    m64 = make_model().double()
    m64.train()
    logits = m64(x.double())
    loss = nn.functional.cross_entropy(logits, target)
    loss.backward()
    m64.eval()
    with torch.no_grad():
        eval_logits = m64(x.double())

    meta = {"format": "pt", "torch": torch.__version__, "generator": "tests/data/make_cnn_reference.py"}
    save_file({k: v.contiguous() for k, v in initial.items()}, os.path.join(out_dir, "cnn_reference_model.safetensors"),
              metadata=meta)
    tensors = {"x": x, "target": target, "logits": logits.detach().float(), "loss": loss.detach().float(),
               "eval_logits": eval_logits.float()}
    tensors.update({"grad." + n: p.grad.float() for n, p in m64.named_parameters()})
    tensors.update({"after." + n: (b.float() if b.is_floating_point() else b) for n, b in m64.named_buffers()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, "cnn_reference.safetensors"),
              metadata=meta)
    print(f"torch {torch.__version__}: loss {loss.item():.9f}; wrote {out_dir}/cnn_reference{{,_model}}.safetensors")


if __name__ == "__main__":
    main()
