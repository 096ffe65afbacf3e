#!/usr/bin/env python3
"""Trains a small MLP with tidepool as PyTorch's CUDA allocator, then shows
the pool's figures, a side stream used safely, and a trim.

    TIDEPOOL_LIB=build/libtidepool.so python3 integrations/pytorch/example.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tidepool_torch  # noqa: E402

MiB = 1 << 20


def show(label):
    st = tidepool_torch.stats()
    print(f"{label:<28} reserved {st['reserved_current'] / MiB:8.1f} MiB "
          f"(peak {st['reserved_peak'] / MiB:8.1f})   used "
          f"{st['used_current'] / MiB:8.1f} MiB (peak {st['used_peak'] / MiB:8.1f})")


def main():
    import torch

    if not torch.cuda.is_available():
        print("this example needs a CUDA GPU")
        return 1
    # First, before any tensor lives on the GPU.
    print(f"tidepool: {tidepool_torch.install()}")
    show("start")

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 10)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(50):
        batch = 64 * (1 + step % 4)  # varying sizes, as real batches have
        x = torch.randn(batch, 1024, device="cuda")
        y = torch.randint(0, 10, (batch,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"loss after 50 steps: {loss.item():.4f}")
    show("after training")

    # A tensor made on a side stream and used on the main one. tidepool
    # frees it in order on the stream it was allocated on (`side`), and
    # PyTorch's record_stream does not reach a pluggable allocator: so the
    # side stream waits for the main stream's use before the tensor goes.
    main_stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(main_stream)
    with torch.cuda.stream(side):
        t = torch.ones(16 * MiB, device="cuda")
    main_stream.wait_stream(side)
    total = t.sum()
    side.wait_stream(main_stream)
    del t
    print(f"side-stream tensor summed on the main stream: {total.item():.0f}")

    del model, opt, x, y, loss
    show("after del")
    tidepool_torch.trim()  # torch.cuda.empty_cache() does the same, all devices
    show("after trim")
    tidepool_torch.reset_peaks()
    show("after reset_peaks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
