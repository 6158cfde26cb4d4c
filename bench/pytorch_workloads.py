#!/usr/bin/python3
"""PyTorch (CPU) versions of bench/workloads.h, timed like bench/step_timer.cc.

Usage: pytorch_workloads.py WORKLOAD [--seconds=S] [--threads=T (default 2)] [--cpu-time]
WORKLOAD: seed_fp32, seed_bf16 (CPU autocast, PyTorch's CPU AMP), mlp_sgd_fp32, mlp_adam_fp32,
          mlp_sgd_bf16, mlp_adam_bf16; fashion_fp32, fashion_fp16 (FP16 autocast + GradScaler, as
          ampgrad's AMP; PyTorch >= 2.3, else it prints nan), fashion_bf16; gpt_fp32, gpt_fp16,
          gpt_bf16 (examples/char_gpt's model and step), gpt2s_fp32, gpt2s_fp16, gpt2s_bf16 (the
          same step at GPT-2 small's shape, T = 256, batch 2), gpt2s1024_* (T = 1024, batch 1),
          gpt6_* (6 layers, width 384, T = 256, batch 8); single ops
          (bench/op_workloads.h): add_bias_{fp32,fp16}, add_residual_{fp32,fp16}, bmm_{fp32,fp16},
          sdpa{256,1024}_{fused,composed}[_dropout]_{fp32,bf16}, heads_{split,packed}_{fp32,bf16},
          gelu_{fp32,bf16}, layer_norm_{fp32,bf16}, adamw_fp32 (adamw_fp32_fused: PyTorch's fused
          CPU AdamW).
Prints "WORKLOAD <median us per step over 5 chunks>" (single ops: then GB/s or GFLOP/s).
--cpu-time (1 thread only) times with the process's CPU clock, as step_timer --cpu-time does.
--version prints the interpreter's torch version and its CPU capability. Standard library + torch only.
"""
import os
import sys
import time

import torch


def make_fashion(name):
    """examples/fashion_mnist's step: 784-512-256-10 MLP, cross_entropy, Adam lr 1e-3, batch 128;
    fashion_cnn_*: its --model=cnn (examples/fashion.h's make_cnn)."""
    torch.manual_seed(0)
    nn = torch.nn
    if name.startswith("fashion_cnn_"):
        model = nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                              nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, labels = torch.randn(128, 784), torch.arange(128) * 7 % 10
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(name.rsplit("_", 1)[1])
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


def make_gpt(name):
    """examples/char_gpt's step (bench/workloads.h GptWorkload): examples/gpt_pytorch.py's model at
    4 layers, width 128, context 64, vocabulary 114 (gpt_*), or at GPT-2 small's shape, 12 layers,
    12 heads, width 768, context 256, vocabulary 50304, batch 2 (gpt2s_*, kGpt2Small), the same at
    context 1024, batch 1 (gpt2s1024_*), or 6 layers, 6 heads, width 384, context 256, vocabulary
    114, batch 8 (gpt6_*, kGpt6Layer); AdamW (0.9,
    0.95) with weight decay 0.1 on matrices only, clip_grad_norm_ 1.0 after unscale_, a batch of
    fixed random tokens (16 for gpt_*)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from gpt_pytorch import GPT  # noqa: E402
    torch.manual_seed(0)
    vocab, block, layers, heads, width, batch = \
        (50304, 1024, 12, 12, 768, 1) if name.startswith("gpt2s1024_") \
        else (50304, 256, 12, 12, 768, 2) if name.startswith("gpt2s_") \
        else (114, 256, 6, 6, 384, 8) if name.startswith("gpt6_") \
        else (114, 64, 4, 4, 128, 16)
    model = GPT(vocab, block, layers, heads, width).init_as_ampgrad_()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = model.adamw()
    x = torch.randint(0, vocab, (batch, block))
    y = torch.randint(0, vocab, (batch * block,))
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(name.rsplit("_", 1)[1])
    scaler = None
    if dtype == torch.float16:
        if not hasattr(torch.amp, "GradScaler"):
            return None  # no CPU GradScaler before PyTorch 2.3
        scaler = torch.amp.GradScaler("cpu")

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y)
        if scaler is None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            scaler.step(opt)
            scaler.update()

    return step


def make_op(name):
    """A single-op workload of bench/op_workloads.h: (function, bytes moved, FLOP)."""
    dtype = torch.float16 if name.endswith("_fp16") else torch.float32
    elem = 2 if dtype == torch.float16 else 4
    if name.startswith("add_"):
        bias = name.startswith("add_bias_")
        x = torch.randn(64, 512, 768).to(dtype)
        y = torch.randn(768).to(dtype) if bias else torch.randn(64, 512, 768).to(dtype)
        return (lambda: x + y), (2 if bias else 3) * x.numel() * elem, 0
    if name.startswith("bmm_"):
        a, b = torch.randn(8, 12, 256, 64).to(dtype), torch.randn(8, 12, 64, 256).to(dtype)
        return (lambda: torch.matmul(a, b)), 0, 2.0 * 96 * 256 * 256 * 64
    if name.startswith("sdpa"):
        # sdpa{256,1024}_{fused,composed}[_dropout]_{fp32,bf16}: PyTorch's fused CPU kernel or its
        # math path, forward + backward of causal attention over [2, 12, T, 64], with dropout_p 0.1
        # for _dropout. The fused kernel has no dropout on the CPU: _fused_dropout runs whatever
        # PyTorch's default SDPA picks (its math path).
        t = 1024 if name.startswith("sdpa1024_") else 256
        qkv = [torch.randn(2, 12, t, 64, dtype=torch.bfloat16 if name.endswith("_bf16") else torch.float32,
                           requires_grad=True) for _ in range(3)]
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
        dropout_p = 0.1 if "_dropout_" in name else 0.0
        backends = [SDPBackend.MATH]
        if "_fused_" in name:
            backends = ([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if dropout_p
                        else [SDPBackend.FLASH_ATTENTION])

        def run():
            with sdpa_kernel(backends):
                attention = torch.nn.functional.scaled_dot_product_attention
                attention(*qkv, is_causal=True, dropout_p=dropout_p).sum().backward()
            for x in qkv:
                x.grad = None

        return run, 0, 3.5 * 4.0 * 24 * t * t * 64 / 2
    if name.startswith("conv_"):
        # conv_{cnn,resnet,depthwise,1x1}_{fp32,bf16}: F.conv2d forward + backward (oneDNN on the
        # CPU): 3x3 into 64 channels, the depthwise 3x3 (groups 64) and the 1x1 of op_workloads.h.
        shape = (128, 32, 14, 14) if name.startswith("conv_cnn_") else (32, 64, 56, 56)
        k = 1 if name.startswith("conv_1x1_") else 3
        groups = shape[1] if name.startswith("conv_depthwise_") else 1
        conv_dtype = torch.bfloat16 if name.endswith("_bf16") else torch.float32
        x = torch.randn(*shape).to(conv_dtype).requires_grad_()
        w = torch.randn(64, shape[1] // groups, k, k).to(conv_dtype).requires_grad_()

        def run():
            torch.nn.functional.conv2d(x, w, padding=k // 2, groups=groups).sum().backward()
            x.grad = w.grad = None

        n, c, h, wd = shape
        return run, 0, 3.0 * 2 * n * 64 * h * wd * (c // groups) * k * k
    if name.startswith("gelu_") or name.startswith("layer_norm_"):
        # gelu_*: tanh GELU over [2048, 1536]; layer_norm_*: layer norm (weight, bias) over
        # [2048, 384]; forward + backward of the sum. Bytes: x read twice, dy read, y and dx written.
        gelu = name.startswith("gelu_")
        op_dtype = torch.bfloat16 if name.endswith("_bf16") else torch.float32
        x = torch.randn(2048, 1536 if gelu else 384).to(op_dtype).requires_grad_()
        w, b = torch.randn(384).to(op_dtype), torch.randn(384).to(op_dtype)

        def run():
            if gelu:
                y = torch.nn.functional.gelu(x, approximate="tanh")
            else:
                y = torch.nn.functional.layer_norm(x, (384,), w, b)
            y.sum().backward()
            x.grad = None

        return run, 5 * x.numel() * x.element_size(), 0
    if name.startswith("adamw_fp32"):
        # adamw_fp32: PyTorch's default AdamW (foreach); adamw_fp32_fused its fused=True CPU kernel.
        params = [torch.randn(2048, 1024, requires_grad=True) for _ in range(8)]
        for p in params:
            p.grad = torch.randn(2048, 1024)
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, **({"fused": True} if name.endswith("_fused") else {}))
        return (lambda: opt.step()), 28.0 * 8 * 2048 * 1024, 0
    if name.startswith("heads_"):
        # heads_{split,packed}_{fp32,bf16}: the same in PyTorch is a split into views (strided, no
        # copies) and its default SDPA, as examples/gpt_pytorch.py's attention; both names run it.
        qkv = torch.randn(2, 256, 3 * 768, dtype=torch.bfloat16 if name.endswith("_bf16") else torch.float32,
                          requires_grad=True)

        def run():
            q, k, v = (y.view(2, 256, 12, 64).transpose(1, 2) for y in qkv.split(768, dim=-1))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            y.transpose(1, 2).reshape(2, 256, 768).sum().backward()
            qkv.grad = None

        return run, 0, 3.5 * 4.0 * 24 * 256 * 256 * 64 / 2
    return None


def make(name):
    if name.startswith("fashion_"):
        return make_fashion(name)
    if name.startswith(("gpt_", "gpt2s_", "gpt2s1024_", "gpt6_")):
        return make_gpt(name)
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


clock = time.perf_counter


def median_seconds_per_call(fn, seconds):
    fn()
    t0 = clock()
    fn()
    one = max(clock() - t0, 1e-9)
    per_chunk = max(1, int(seconds / 5 / one))
    chunks = []
    for _ in range(5):
        start = clock()
        for _ in range(per_chunk):
            fn()
        chunks.append((clock() - start) / per_chunk)
    return sorted(chunks)[2]


def main():
    global clock
    name = sys.argv[1]
    seconds, threads = 2.0, 2
    for arg in sys.argv[2:]:
        if arg.startswith("--seconds="):
            seconds = float(arg.split("=", 1)[1])
        if arg.startswith("--threads="):
            threads = int(arg.split("=", 1)[1])
        if arg == "--cpu-time":
            clock = time.process_time
    if clock is time.process_time and threads != 1:
        sys.exit("pytorch_workloads: --cpu-time needs --threads=1")
    torch.set_num_threads(threads)  # Debian's torch starts with 1 thread here
    if name == "--version":
        print(f"torch {torch.__version__} (CPU capability {torch.backends.cpu.get_cpu_capability()})"
              if hasattr(torch.backends, "cpu") else f"torch {torch.__version__}")
        return
    op = make_op(name)
    if op is not None:
        fn, size, flop = op
        s = median_seconds_per_call(fn, seconds)
        print(f"{name} {s * 1e6:.3f} {(size or flop) / s / 1e9:.2f}", flush=True)
        return
    step = make(name)
    if step is None:
        print(f"{name}: needs a newer PyTorch than {torch.__version__}", file=sys.stderr)
        print(f"{name} nan", flush=True)
        return
    print(f"{name} {median_seconds_per_call(step, seconds) * 1e6:.3f}", flush=True)


if __name__ == "__main__":
    main()
