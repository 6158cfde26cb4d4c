#!/usr/bin/env python3
"""Writes the PyTorch reference of the FP8 scaling recipes for //tests:float8_scaling_test (run
once; the output is committed).

Delayed scaling follows Transformer Engine's PyTorch implementation (amax history of a window,
its max or most recent entry, the window rolled one place, scale = (fp8_max / amax) / 2^margin
kept when amax is 0, inf or NaN), with FLT_MAX for a quotient that overflows (as TE's C++
current scaling), FLT_MIN at the least, and the power-of-two option; every step in float32
tensors.

  configs        [C, 5] I64   amax_history_len, amax_compute (0 max, 1 most recent), margin,
                              power_of_two, format (0 e4m3, 1 e5m2)
  amaxes         [S] F32      the amax recorded at each step: log-uniform over float32's range,
                              with 0, inf, NaN, subnormals and values whose reciprocal overflows
  scales         [C, S] F32   each config's scale after each step
  histories      [C, S, 16] F32  its amax history after each step (zero past its length)
  current.x      [K, 1024] F32   tensors of various magnitudes (one all zero, one holding inf)
  current.<f>.scale [K] F32   current scaling from 1: amax = x.abs().max(), margin 0
  current.<f>.codes [K, 1024] U8  (x * scale).clamp(-max, max).to(float8): the scaled
                              saturating cast
Usage: PYTHON tests/data/make_float8_scaling_reference.py [OUT_DIR] (default: this script's folder).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_float8_reference import save  # noqa: E402

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]
FLT_MAX = torch.finfo(torch.float32).max
FLT_MIN = torch.finfo(torch.float32).tiny


def compute_scale(amax, previous, fp8_max, margin, power_of_two):
    """float32 tensors of shape []: Transformer Engine's _default_sf_compute, with ampgrad's two
    guards (FLT_MAX for a quotient that overflows, FLT_MIN at the least) and power-of-two option."""
    sf = torch.tensor(fp8_max, dtype=torch.float32) / amax
    sf = torch.where(torch.isinf(sf), torch.tensor(FLT_MAX), sf)
    sf = torch.clamp(sf / (2 ** margin), min=FLT_MIN)
    sf = torch.where(amax > 0.0, sf, previous)
    sf = torch.where(torch.isfinite(amax), sf, previous)
    if power_of_two:
        _, exponent = torch.frexp(sf)
        sf = torch.ldexp(torch.tensor(1.0), exponent - 1)
    return sf


def delayed(amaxes, length, most_recent, margin, power_of_two, fmt):
    fp8_max = torch.finfo(fmt).max
    history = torch.zeros(length, dtype=torch.float32)
    scale = torch.tensor(1.0, dtype=torch.float32)
    scales, histories = [], []
    for a in amaxes:
        history[0] = torch.maximum(history[0], a)  # NaN propagates
        amax = history[0].clone() if most_recent else torch.max(history)
        history = torch.roll(history, -1, 0)
        history[0] = 0.0
        scale = compute_scale(amax, scale, fp8_max, margin, power_of_two)
        scales.append(scale.clone())
        padded = torch.zeros(16, dtype=torch.float32)
        padded[:length] = history
        histories.append(padded)
    return torch.stack(scales), torch.stack(histories)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    g = torch.Generator().manual_seed(0)
    random = torch.exp2(torch.rand(40, generator=g, dtype=torch.float64) * 60 - 30).to(torch.float32)
    special = torch.tensor([0.0, float("inf"), float("nan"), 1e-40, 1e-44, 1e30, 3e38, 448.0, 57344.0, 1.0],
                           dtype=torch.float32)
    # Specials spread among random values, so that each is seen leaving the window too.
    amaxes = torch.cat([random[:8], special[:3], random[8:16], special[3:6], random[16:28], special[6:],
                        random[28:]])
    configs, scales, histories = [], [], []
    for length in (1, 4, 16):
        for most_recent in (0, 1):
            for margin in (0, 2):
                for power_of_two in (0, 1):
                    for f, fmt in enumerate(FORMATS):
                        configs.append([length, most_recent, margin, power_of_two, f])
                        s, h = delayed(amaxes, length, most_recent, margin, power_of_two, fmt)
                        scales.append(s)
                        histories.append(h)
    tensors = {
        "configs": torch.tensor(configs, dtype=torch.int64),
        "amaxes": amaxes,
        "scales": torch.stack(scales),
        "histories": torch.stack(histories),
    }
    magnitudes = [1e-30, 1e-6, 1e-3, 1.0, 3.0, 1e3, 1e5, 1e30]
    x = torch.stack([torch.randn(1024, generator=g) * m for m in magnitudes] + [torch.zeros(1024)])
    with_inf = torch.randn(1024, generator=g)
    with_inf[7] = float("inf")
    x = torch.cat([x, with_inf[None]])
    tensors["current.x"] = x
    for name, fmt in zip(("e4m3", "e5m2"), FORMATS):
        fp8_max = torch.finfo(fmt).max
        amax = x.abs().amax(dim=1)
        scale = torch.stack([compute_scale(a, torch.tensor(1.0), fp8_max, 0, False) for a in amax])
        tensors[f"current.{name}.scale"] = scale
        tensors[f"current.{name}.codes"] = (x * scale[:, None]).clamp(-fp8_max, fp8_max).to(fmt).view(torch.uint8)
    save(os.path.join(out_dir, "float8_scaling_reference.safetensors"), tensors, {"torch": torch.__version__})


if __name__ == "__main__":
    main()
