#!/usr/bin/env python3
"""PyTorch (CUDA) versions of bench/cuda_bench.cc's training steps, timed the same way.

Usage: pytorch_cuda_workloads.py [--iters=N] [--sdpa-math] [seed] [mlp] [gpt] [gpt2] [conv]   (default: all five)
The steps: Linear layers with ReLU between them, mse_loss, Adam lr 1e-4, zero_grad each step:
  seed   Linear(10,1), batch 64
  mlp    3 x Linear(4096,4096), batch 4096
and examples/char_gpt's step (bench/workloads.h GptWorkload): examples/gpt_pytorch.py's model,
vocabulary 114, cross_entropy, AdamW lr 1e-3 (0.9, 0.95) with weight decay 0.1 on matrices only,
clip_grad_norm_ 1.0 after unscale_, one fixed batch of random characters:
  gpt4x128  4 layers, 4 heads, width 128, context 64, batch 16 (char_gpt's default)
  gpt6x384  6 layers, 6 heads, width 384, context 256, batch 64 (bench/workloads.h kGptLarge)
  gpt2      GPT-2 small: 12 layers, 12 heads, width 768, context 1024, batch 8, vocabulary 50304
            (cuda_bench's gpt2 row), with tokens/s; gpt2c the same under torch.compile, fused AdamW
each in FP32 (TF32 off, PyTorch's default for matmuls), FP16 autocast with a GradScaler, and BF16
autocast without one; Adam/AdamW as PyTorch runs it by default (foreach) and with fused=True.
16-bit GEMMs add split-K partials in FP32, as ampgrad's do (PyTorch's default allows 16-bit ones).
Prints one line per step: "NAME PRECISION ADAM <mean ms per step> <peak MiB> <first loss> <last loss>",
the mean over N steps (default 10; seed 200, gpt4x128 50, gpt6x384 20, as cuda_bench) after 2
warm-up steps, synchronised at both ends, as cuda_bench's time_per_call does; for seed and mlp
then the phases (zero_grad + forward + loss, backward, unscale + step + update), each timed alone
over 10 more steps, as cuda_bench's. PyTorch's scaled_dot_product_attention picks its fused
kernels (flash or memory-efficient attention), as ampgrad's does in FP16 and BF16; --sdpa-math
makes it compute attention as ampgrad's FP32 path on CUDA does (matmul, softmax, matmul). Standard
library + torch only.
"""
import contextlib
import os
import sys
import time

import torch


def amp_of(precision):
    """A precision's autocast (a function that makes the context) and GradScaler: fp32 neither,
    fp16 both, bf16 autocast alone."""
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    return (lambda: torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None)), scaler


def step_fn(model, x, y, precision, fused):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=fused)
    autocast, scaler = amp_of(precision)
    losses = []

    def forward():
        opt.zero_grad()
        with autocast():
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


def gpt_step_fn(shape, precision, fused, vocab=114, compiled=False):
    """examples/char_gpt's step on one fixed batch, as bench/pytorch_workloads.py's make_gpt on the
    CPU; compiled: the model under torch.compile (its default mode)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [os.path.join(here, "..", "examples"), here]  # the repo's layout, or the GPU bundle's
    from gpt_pytorch import GPT  # noqa: E402
    n_layer, n_head, n_embd, block, batch = shape
    torch.manual_seed(0)
    model = GPT(vocab, block, n_layer, n_head, n_embd).init_as_ampgrad_().cuda()
    params = [p for p in model.parameters() if p.requires_grad]
    run = torch.compile(model) if compiled else model
    opt = model.adamw(**({"fused": True} if fused else {"foreach": True}))
    x = torch.randint(0, vocab, (batch, block), device="cuda")
    y = torch.randint(0, vocab, (batch * block,), device="cuda")
    autocast, scaler = amp_of(precision)
    losses = []

    def step():
        opt.zero_grad()
        with autocast():
            logits = run(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach())

    return [step], losses


def time_step(name, widths, batch, precision, fused, iters):
    torch.manual_seed(0)
    model = make_model(widths)
    x = torch.randn(batch, widths[0], device="cuda")
    y = torch.randn(batch, widths[-1], device="cuda")
    phases, losses = step_fn(model, x, y, precision, fused)
    time_phases(name, phases, losses, precision, fused, iters)


def time_phases(name, phases, losses, precision, fused, iters, tokens=0):
    """Times one step (the phases in order), then each phase alone when there are several;
    tokens: the tokens a step trains on, for tokens/s."""

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
    line = (f"{name:8s} {precision:5s} {'fused' if fused else 'foreach':8s} {ms:10.4f} ms {peak:7.0f} MiB "
            f"loss {first:.4g} -> {last:.4g}")
    if tokens:
        line += f"  {tokens / ms * 1e3:.0f} tokens/s"
    if len(phases) == 1:
        print(line, flush=True)
        return
    phase_ms = [0.0] * len(phases)  # each phase timed alone, the GPU drained before and after it
    for _ in range(min(iters, 10)):
        for i, phase in enumerate(phases):
            torch.cuda.synchronize()
            start = time.perf_counter()
            phase()
            torch.cuda.synchronize()
            phase_ms[i] += (time.perf_counter() - start) * 1e3 / min(iters, 10)
    print(line + "  phases (forward, backward, optimizer) " + " ".join(f"{t:.3f}" for t in phase_ms) + " ms",
          flush=True)


def time_conv(iters):
    """cuda_bench's conv2d rows: F.conv2d forward + backward (cuDNN), 3x3, padding 1, into 64
    channels, in fp32 (no TF32), fp16 and bf16; TFLOP/s = 3 x the forward's 2 N O L C 9."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    for shape in ((128, 32, 14, 14), (32, 64, 56, 56)):
        n, c, h, w = shape
        flop = 3.0 * 2 * n * 64 * h * w * c * 9
        rates = []
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(64, c, 3, 3, device="cuda", dtype=dtype, requires_grad=True)

            def run():
                torch.nn.functional.conv2d(x, k, padding=1).sum().backward()
                x.grad = k.grad = None

            for _ in range(3):
                run()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(iters):
                run()
            torch.cuda.synchronize()
            rates.append(flop / ((time.perf_counter() - start) / iters) / 1e12)
        print(f"conv x {list(shape)}: " + " ".join(f"{r:.1f} TF/s" for r in rates) + " (fp32 fp16 bf16)", flush=True)


def main():
    iters, sdpa_math, steps = 10, False, []
    for arg in sys.argv[1:]:
        if arg.startswith("--iters="):
            iters = int(arg.split("=", 1)[1])
        elif arg == "--sdpa-math":
            sdpa_math = True
        elif arg in ("seed", "mlp", "gpt", "gpt2", "conv"):
            steps.append(arg)
        else:
            sys.exit(__doc__)
    steps = steps or ["seed", "mlp", "gpt", "gpt2", "conv"]
    torch.backends.cuda.matmul.allow_tf32 = False
    # As ampgrad's GEMMs: 16-bit split-K partials are not added in 16 bits.
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    if "conv" in steps:
        time_conv(iters)
    for fused in (False, True):
        for precision in ("fp32", "fp16", "bf16"):
            if "seed" in steps:
                time_step("seed", [10, 1], 64, precision, fused, max(iters, 200))
            if "mlp" in steps:
                time_step("mlp", [4096, 4096, 4096, 4096], 4096, precision, fused, iters)
    if "gpt" not in steps and "gpt2" not in steps:
        return
    attention = contextlib.nullcontext()
    if sdpa_math:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        attention = sdpa_kernel(SDPBackend.MATH)
        # The math backend upcasts 16-bit q, k, v to FP32 unless told otherwise; ampgrad's attention
        # matmuls run in the autocast dtype (its softmax in FP32, PyTorch's then in 16 bits).
        if hasattr(torch.backends.cuda, "allow_fp16_bf16_reduction_math_sdp"):
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    print(f"gpt: scaled_dot_product_attention {'math (as ampgrad)' if sdpa_math else 'PyTorch default'}", flush=True)
    with attention:
        for fused in (False, True) if "gpt" in steps else ():
            for precision in ("fp32", "fp16", "bf16"):
                for name, shape, n in (("gpt4x128", (4, 4, 128, 64, 16), 50), ("gpt6x384", (6, 6, 384, 256, 64), 20)):
                    phases, losses = gpt_step_fn(shape, precision, fused)
                    time_phases(name, phases, losses, precision, fused, max(iters, n))
        # GPT-2 small (cuda_bench's gpt2 row): eager with foreach and fused AdamW, then compiled.
        gpt2, tokens = (12, 12, 768, 1024, 8), 8 * 1024
        for compiled in (False, True) if "gpt2" in steps else ():
            for fused in (True,) if compiled else (False, True):
                for precision in ("fp32", "fp16", "bf16"):
                    phases, losses = gpt_step_fn(gpt2, precision, fused, vocab=50304, compiled=compiled)
                    name = "gpt2c" if compiled else "gpt2"
                    time_phases(name, phases, losses, precision, fused, max(iters, 10), tokens)
                    del phases, losses
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
