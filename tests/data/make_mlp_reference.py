#!/usr/bin/env python3
"""Writes the PyTorch reference of //tests:mlp_reference_test (run once; the outputs are committed).

The model is examples/fashion.h's MLP classifier at narrower widths (784-16-16-10: the same layers,
a small file): nn.Sequential(Linear, ReLU, Linear, ReLU, Linear) with PyTorch's default init under
torch.manual_seed(0), on a fixed batch of 8 normalised-image-like inputs with labels. It runs
forward + cross_entropy + backward twice:
  - in float64 (the weights and inputs are float32 values), rounded to float32 when stored;
  - under CPU FP16 autocast (PyTorch's torch.autocast("cpu", dtype=torch.float16)) on the float32
    model, so the FP16 roundings are PyTorch's own.
Outputs, in OUT_DIR (default: this script's folder):
  mlp_reference_model.safetensors  the weights under their state_dict names (0.weight, 0.bias, ...)
  mlp_reference.safetensors        x [8, 784] F32, target [8] I64, logits [8, 10], loss [],
                                   grad.<name> for every parameter (float64 run, stored F32);
                                   autocast.logits (F16), autocast.loss, autocast.grad.<name> (F32)
Usage: PYTHON tests/data/make_mlp_reference.py [OUT_DIR], where PYTHON has torch 2.x (CPU FP16
autocast needs 2.x). safetensors is used when installed; otherwise the format is written here.
"""
import json
import os
import struct
import sys

import torch

HIDDEN = (16, 16)
BATCH = 8


def make_model():
    torch.manual_seed(0)
    layers, width = [], 784
    for h in HIDDEN:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def forward_backward(model, x, target, autocast):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, target)
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.float64: "F64", torch.int64: "I64"}


def save(path, tensors, metadata):
    """The safetensors format: u64 header length, JSON header, raw little-endian bytes."""
    try:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=metadata)
        return
    except ImportError:
        pass
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    model = make_model()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 784, generator=gen)
    target = torch.tensor([0, 1, 2, 3, 4, 7, 8, 9], dtype=torch.int64)

    logits64, loss64, grads64 = forward_backward(make_model().double(), x.double(), target, autocast=False)
    logits16, loss16, grads16 = forward_backward(model, x, target, autocast=True)
    assert logits16.dtype == torch.float16 and loss16.dtype == torch.float32

    meta = {"format": "pt", "torch": torch.__version__, "generator": "tests/data/make_mlp_reference.py"}
    save(os.path.join(out_dir, "mlp_reference_model.safetensors"), dict(model.state_dict()), meta)
    tensors = {"x": x, "target": target, "logits": logits64.float(), "loss": loss64.float()}
    tensors.update({"grad." + n: g.float() for n, g in grads64.items()})
    tensors.update({"autocast.logits": logits16, "autocast.loss": loss16})
    tensors.update({"autocast.grad." + n: g for n, g in grads16.items()})
    save(os.path.join(out_dir, "mlp_reference.safetensors"), tensors, meta)
    print(f"torch {torch.__version__}: loss float64 {loss64.item():.9f}, FP16 autocast {loss16.item():.9f}; "
          f"wrote {out_dir}/mlp_reference{{,_model}}.safetensors")


if __name__ == "__main__":
    main()
