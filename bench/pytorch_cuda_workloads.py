#!/usr/bin/env python3
"""PyTorch (CUDA) versions of bench/cuda_bench.cc's training steps, timed the same way.

Usage: pytorch_cuda_workloads.py [--iters=N]
The steps: Linear layers with ReLU between them, mse_loss, Adam lr 1e-4, zero_grad each step:
  seed   Linear(10,1), batch 64
  mlp    3 x Linear(4096,4096), batch 4096
each in FP32 (TF32 off, PyTorch's default for matmuls), FP16 autocast with a GradScaler, and BF16
autocast without one; Adam as PyTorch runs it by default (foreach) and with fused=True. 16-bit
GEMMs add split-K partials in FP32, as ampgrad's do (PyTorch's default allows 16-bit ones).
Prints one line per step: "NAME PRECISION ADAM <mean ms per step> <peak MiB> <first loss> <last loss>",
the mean over N steps (default 10; seed 200) after 2 warm-up steps, synchronised at both ends,
as cuda_bench's time_per_call does; then the phases (zero_grad + forward + loss, backward,
unscale + step + update), each timed alone over 10 more steps, as cuda_bench's. Standard library
+ torch only.
"""
import sys
import time

import torch


def step_fn(model, x, y, precision, fused):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=fused)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    losses = []

    def forward():
        opt.zero_grad()
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            losses.append(torch.nn.functional.mse_loss(model(x).float(), y))

    def backward():
        scaler.scale(losses[-1]).backward()
        losses[-1] = losses[-1].detach()

    def optimizer():
        scaler.step(opt)
        scaler.update()

    return [forward, backward, optimizer], losses


def make_model(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def time_step(name, widths, batch, precision, fused, iters):
    torch.manual_seed(0)
    model = make_model(widths)
    x = torch.randn(batch, widths[0], device="cuda")
    y = torch.randn(batch, widths[-1], device="cuda")
    phases, losses = step_fn(model, x, y, precision, fused)

    def step():
        for phase in phases:
            phase()

    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / iters * 1e3
    peak = torch.cuda.max_memory_allocated() / 2**20
    first, last = losses[0].item(), losses[-1].item()
    phase_ms = [0.0] * len(phases)  # each phase timed alone, the GPU drained before and after it
    for _ in range(min(iters, 10)):
        for i, phase in enumerate(phases):
            torch.cuda.synchronize()
            start = time.perf_counter()
            phase()
            torch.cuda.synchronize()
            phase_ms[i] += (time.perf_counter() - start) * 1e3 / min(iters, 10)
    print(f"{name:5s} {precision:5s} {'fused' if fused else 'foreach':8s} {ms:10.4f} ms {peak:7.0f} MiB "
          f"loss {first:.4g} -> {last:.4g}  phases (forward, backward, optimizer) "
          + " ".join(f"{t:.3f}" for t in phase_ms) + " ms", flush=True)


def main():
    iters = 10
    for arg in sys.argv[1:]:
        if arg.startswith("--iters="):
            iters = int(arg.split("=", 1)[1])
        else:
            sys.exit(__doc__)
    torch.backends.cuda.matmul.allow_tf32 = False
    # As ampgrad's GEMMs: 16-bit split-K partials are not added in 16 bits.
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for fused in (False, True):
        for precision in ("fp32", "fp16", "bf16"):
            time_step("seed", [10, 1], 64, precision, fused, max(iters, 200))
            time_step("mlp", [4096, 4096, 4096, 4096], 4096, precision, fused, iters)


if __name__ == "__main__":
    main()
