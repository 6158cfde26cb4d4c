#!/usr/bin/python3
"""PyTorch (CPU) versions of bench/workloads.h, timed like bench/step_timer.cc.

Usage: pytorch_workloads.py WORKLOAD [--seconds=S] [--threads=T (default 2)]
WORKLOAD: seed_fp32, seed_bf16 (CPU autocast, PyTorch's CPU AMP), mlp_sgd_fp32, mlp_adam_fp32,
          mlp_sgd_bf16, mlp_adam_bf16; fashion_fp32, fashion_fp16 (FP16 autocast + GradScaler, as
          ampgrad's AMP; PyTorch >= 2.3, else it prints nan), fashion_bf16.
Prints "WORKLOAD <median us per step over 5 chunks>". Standard library + torch only.
"""
import sys
import time

import torch


def make_fashion(name):
    """examples/fashion_mnist's step: 784-512-256-10 MLP, cross_entropy, Adam lr 1e-3, batch 128."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, labels = torch.randn(128, 784), torch.arange(128) * 7 % 10
    dtype = {"fashion_fp16": torch.float16, "fashion_bf16": torch.bfloat16}.get(name)
    scaler = None
    if dtype == torch.float16:
        if not hasattr(torch.amp, "GradScaler"):
            return None  # no CPU GradScaler before PyTorch 2.3
        scaler = torch.amp.GradScaler("cpu")

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    return step


def make(name):
    if name.startswith("fashion_"):
        return make_fashion(name)
    torch.manual_seed(0)
    if name.startswith("seed"):
        model = torch.nn.Linear(10, 1)
        batch, n_in, n_out, adam = 64, 10, 1, True
    else:
        model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                    torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        batch, n_in, n_out, adam = 256, 784, 10, "adam" in name
    if adam:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(batch, n_in), torch.randn(batch, n_out)
    autocast = name.endswith("_bf16")  # bf16 needs no loss scaling (PyTorch 1.13 has no CPU GradScaler)

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.float().backward()
        opt.step()

    return step


def median_seconds_per_call(fn, seconds):
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-9)
    per_chunk = max(1, int(seconds / 5 / one))
    chunks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(per_chunk):
            fn()
        chunks.append((time.perf_counter() - start) / per_chunk)
    return sorted(chunks)[2]


def main():
    name = sys.argv[1]
    seconds, threads = 2.0, 2
    for arg in sys.argv[2:]:
        if arg.startswith("--seconds="):
            seconds = float(arg.split("=", 1)[1])
        if arg.startswith("--threads="):
            threads = int(arg.split("=", 1)[1])
    torch.set_num_threads(threads)  # Debian's torch starts with 1 thread here
    step = make(name)
    if step is None:
        print(f"{name}: needs a newer PyTorch than {torch.__version__}", file=sys.stderr)
        print(f"{name} nan", flush=True)
        return
    print(f"{name} {median_seconds_per_call(step, seconds) * 1e6:.3f}", flush=True)


if __name__ == "__main__":
    main()
