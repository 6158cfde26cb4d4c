#!/usr/bin/env python3
"""Writes the PyTorch reference of //tests:float8_test (run once; the output is committed).

For each 8-bit float, e4m3 (torch.float8_e4m3fn) and e5m2 (torch.float8_e5m2):
  <f>.decode        [256] F32    each code's value, code.view(float8).to(float32) (NaN bits included)
  <f>.from_f32      [N] F32      inputs: every code's value, every midpoint between neighbouring
                                 values and the floats just either side of it, the range's edges
                                 (max, the midpoint past it, the overflow threshold, inf, NaN, the
                                 subnormal boundary), float32 subnormals, and random floats of
                                 log-uniform magnitude over the whole float32 range
  <f>.from_f32.cast [N] U8       x.to(float8), as codes (PyTorch's rounding and overflow)
  <f>.from_f32.saturate [N] U8   x.clamp(-max, max).to(float8): the saturating cast of the FP8
                                 scaling recipes (torchao's to_fp8_saturated; NaN stays NaN)
  <f>.from_f64      [M] F64      the float32 inputs widened, plus each midpoint nudged by 2^-40 of
                                 itself either way (float32 cannot hold those: they tell whether a
                                 float64 input is rounded once or through float32)
  <f>.from_f64.cast [M] U8
  <f>.from_f16.cast [65536] U8   every float16 bit pattern 0..65535 (in order) cast to float8
  <f>.from_bf16.cast [65536] U8  every bfloat16 bit pattern cast to float8
Metadata: the torch version that produced it.
Usage: PYTHON tests/data/make_float8_reference.py [OUT_DIR] (default: this script's folder).
"""
import json
import os
import struct
import sys

import torch

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
SAFETENSORS = {torch.float32: "F32", torch.float64: "F64", torch.uint8: "U8", torch.int64: "I64"}


def save(path, tensors, metadata):
    """The safetensors format: u64 header length, JSON header, raw little-endian bytes."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        blob = t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.uint8 else t.numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def codes(x, dtype):
    return x.to(dtype).view(torch.uint8)


def float32_inputs(dtype, generator):
    values = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)
    finite = torch.sort(torch.unique(values[torch.isfinite(values) & (values >= 0)]))[0].to(torch.float64)
    mids = ((finite[1:] + finite[:-1]) / 2).to(torch.float32)  # exact: a few bits each
    fmax = torch.finfo(dtype).max
    step = finite[-1] - finite[-2]
    edges = torch.tensor([fmax, fmax + step / 2, fmax + step, 2 * fmax, 1e30, float("inf"), float("nan"),
                          float(finite[1]) / 2, float(finite[1]) / 4, 1e-30, 1e-45, 0.0], dtype=torch.float64)
    edges = torch.cat([edges, torch.tensor([464.0, 479.0, 480.0, 481.0, 61440.0, 65535.0, 65536.0],
                                           dtype=torch.float64)]).to(torch.float32)
    around = torch.cat([mids, edges])
    up = torch.nextafter(around, torch.tensor(float("inf")))
    down = torch.nextafter(around, torch.tensor(float("-inf")))
    exponent = torch.rand(20000, generator=generator, dtype=torch.float64) * 280 - 150
    random = (torch.exp2(exponent) * torch.rand(20000, generator=generator, dtype=torch.float64) * 2).to(torch.float32)
    positive = torch.cat([values.abs(), around, up, down, random])
    x = torch.cat([positive, -positive])
    nan_bits = torch.tensor([0x7FC00000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF], dtype=torch.int64)
    return torch.cat([x, nan_bits.to(torch.int32).view(torch.float32)]), mids


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    every16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    for name, dtype in FORMATS.items():
        tensors[f"{name}.decode"] = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)
        x, mids = float32_inputs(dtype, generator)
        fmax = torch.finfo(dtype).max
        tensors[f"{name}.from_f32"] = x
        tensors[f"{name}.from_f32.cast"] = codes(x, dtype)
        tensors[f"{name}.from_f32.saturate"] = codes(x.clamp(-fmax, fmax), dtype)
        m = mids.to(torch.float64)
        nudged = torch.cat([m * (1 + 2.0 ** -40), m * (1 - 2.0 ** -40)])
        x64 = torch.cat([x.to(torch.float64), nudged, -nudged])
        tensors[f"{name}.from_f64"] = x64
        tensors[f"{name}.from_f64.cast"] = codes(x64, dtype)
        tensors[f"{name}.from_f16.cast"] = codes(every16.view(torch.float16), dtype)
        tensors[f"{name}.from_bf16.cast"] = codes(every16.view(torch.bfloat16), dtype)
    save(os.path.join(out_dir, "float8_reference.safetensors"), tensors, {"torch": torch.__version__})


if __name__ == "__main__":
    main()
