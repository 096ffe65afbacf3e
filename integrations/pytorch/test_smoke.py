#!/usr/bin/env python3
"""Smoke test of tidepool as PyTorch's CUDA allocator.

Installs tidepool through tidepool_torch, then allocates tensors of many
sizes, runs matmuls, elementwise work, autograd and a side stream, and checks
the results against the CPU and the pool's statistics against what was
allocated and freed. Where PyTorch or a CUDA device is absent it prints SKIP
and exits 0, so that CI without a GPU passes. Exit 1 on any failure.

    TIDEPOOL_LIB=build/libtidepool.so python3 integrations/pytorch/test_smoke.py
"""

import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, skip  # noqa: E402

MiB = 1 << 20


def fmt(st):
    return ", ".join(f"{k} {v / MiB:.2f} MiB" for k, v in st.items())


def main():
    try:
        import torch
    except ImportError:
        skip("PyTorch is not installed here; the tidepool integration is not tested")
    if not torch.cuda.is_available():
        skip(f"PyTorch {torch.__version__} sees no CUDA device; nothing to test")

    import tidepool_torch as tt

    path = tt.install()  # before the first CUDA tensor
    print(f"tidepool {path}")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name()}, allocator backend "
          f"{torch.cuda.get_allocator_backend()!r}")
    dev = torch.cuda.current_device()
    base = tt.stats()
    print(f"start: {fmt(base)}")

    # One tensor: the used figure grows by its bytes, the pointer is aligned.
    a = torch.randint(-4, 5, (1024, 1024), device="cuda").float()
    st = tt.stats()
    check(a.data_ptr() != 0 and a.data_ptr() % 512 == 0,
          f"tensor pointer {a.data_ptr():#x} is non-null and 512-aligned")
    check(st["used_current"] >= base["used_current"] + 4 * MiB,
          f"used grew by at least 4 MiB ({fmt(st)})")
    check(st["reserved_current"] >= st["used_current"], "reserved >= used")
    check(st["used_peak"] >= st["used_current"], "used peak >= used")

    # Small integers keep fp32 (and TF32) matmul exact: compare bitwise.
    c = a @ a
    check(torch.equal(c.cpu(), a.cpu() @ a.cpu()), "matmul equals the CPU's")
    e = (a * 2 + 1).sum(dim=0)
    check(torch.equal(e.cpu(), (a.cpu() * 2 + 1).sum(dim=0)),
          "elementwise and reduction equal the CPU's")

    # Frees come back to the pool (PyTorch keeps its cuBLAS workspace, so
    # the figure need not fall back to the start).
    torch.cuda.synchronize()
    before = tt.stats()
    del a, c, e
    after = tt.stats()
    check(after["used_current"] <= before["used_current"] - 8 * MiB,
          f"freeing 8 MiB of tensors lowers used ({before['used_current']} -> "
          f"{after['used_current']})")

    # Many live tensors of many sizes: each filled with its own value and
    # checked after all were allocated, so that overlapping allocations show.
    g = torch.Generator().manual_seed(7)
    sizes = [int(s) for s in torch.randint(1, 4 * MiB, (120,), generator=g)]
    sizes += [1, 3, 511, 513, 64 * MiB // 4, 2 * MiB // 4 + 1]
    live = []
    for i, n in enumerate(sizes):
        t = torch.empty(n, device="cuda", dtype=torch.float32)
        t.fill_(float(i % 1000))
        live.append((i, t))
    for round_ in range(2):
        ok = all(bool((t == float(i % 1000)).all()) for i, t in live)
        check(ok, f"{len(live)} live tensors keep their own values (round {round_})")
        # Drop every other one and allocate again in the holes.
        kept = live[::2]
        live = kept + [(1000 + j, torch.full((n // 3 + 1,), float((1000 + j) % 1000),
                                             device="cuda"))
                       for j, n in enumerate(sizes[1::2])]
    total = sum(t.numel() * 4 for _, t in live)
    st = tt.stats()
    check(st["used_current"] >= total, f"used ({st['used_current']}) covers the "
          f"{total} bytes of live tensors")

    # Autograd on float64, against the CPU (tolerance for reduction order).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 10)).double()
    x = torch.randn(64, 256, dtype=torch.float64)
    y = torch.randint(0, 10, (64,))
    grads = []
    for device in ("cpu", "cuda"):
        m = model.to(device)
        m.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x.to(device)), y.to(device))
        loss.backward()
        grads.append([p.grad.detach().cpu().clone() for p in m.parameters()])
    check(all(torch.allclose(g0, g1, rtol=1e-9, atol=1e-12)
              for g0, g1 in zip(*grads)), "autograd gradients equal the CPU's")
    del model, m, loss

    # A side stream, synchronised as README.md asks: the main stream waits
    # for the side stream's work before using its tensor, and the side
    # stream waits for the main stream's use before the tensor is freed.
    main_stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(main_stream)
    with torch.cuda.stream(side):
        s = torch.full((4 * MiB,), 3.0, device="cuda")  # allocated on `side`
    main_stream.wait_stream(side)
    total_s = s.sum()
    side.wait_stream(main_stream)
    del s  # freed on `side`, after the main stream's sum
    check(float(total_s) == 12.0 * MiB, "side-stream tensor summed on the main stream")

    # Tensor.record_stream: a tensor of the main stream read by a busy side
    # stream. Its free on the main stream makes the main stream wait for the
    # side stream's work, so that no later allocation can take the memory
    # while that work runs.
    busy = torch.cuda.Stream()
    x = torch.ones(MiB, device="cuda")
    busy.wait_stream(main_stream)
    with torch.cuda.stream(busy):
        torch.cuda._sleep(400_000_000)  # a fraction of a second
        x_sum = x.sum()
    x.record_stream(busy)
    main_stream.synchronize()
    del x
    check(not main_stream.query(),
          "record_stream: the free waits for the recorded stream's work")
    busy.synchronize()
    main_stream.synchronize()
    check(float(x_sum) == float(MiB), "the recorded stream read the tensor")

    # torch.cuda.graph: what the capture allocates is the graph's, not the
    # pool's (PyTorch announces the capture to tidepool).
    g = torch.cuda.CUDAGraph()
    inp = torch.full((MiB,), 2.0, device="cuda")
    (inp * 3).sum()  # eager once first, as PyTorch advises before a capture
    torch.cuda.synchronize()
    gc.collect()  # torch.cuda.graph collects too: frees must not come inside
    used_before = tt.stats()["used_current"]
    with torch.cuda.graph(g):
        out = (inp * 3).sum()  # a 4 MiB intermediate
    # PyTorch's own few bytes before the capture (its generator's state)
    # come from the pool; the intermediate must not.
    grown = tt.stats()["used_current"] - used_before
    check(0 <= grown < MiB,
          f"allocations inside a capture are the graph's, not the pool's "
          f"(the pool's bytes in use grew by {grown})")
    g.replay()
    check(float(out) == 6.0 * MiB, "the captured graph replays correctly")
    del g, out, inp

    # Zero-sized tensors need no memory.
    z = torch.empty(0, device="cuda")
    check(z.numel() == 0, "zero-sized tensor")

    # Peaks reset to the current figures; trim gives free memory back.
    tt.reset_peaks()
    st = tt.stats(dev)
    check(st["used_peak"] == st["used_current"]
          and st["reserved_peak"] == st["reserved_current"],
          f"reset_peaks: peaks equal current ({fmt(st)})")
    del live, z
    before = tt.stats(torch.device("cuda", dev))
    tt.trim()
    after = tt.stats()
    check(after["reserved_current"] < before["reserved_current"]
          and after["reserved_current"] >= after["used_current"],
          f"trim: reserved {before['reserved_current'] / MiB:.1f} -> "
          f"{after['reserved_current'] / MiB:.1f} MiB, used "
          f"{after['used_current'] / MiB:.1f} MiB")

    # torch.cuda.empty_cache() reaches tidepool and gives free memory back.
    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del big
    before = tt.stats()
    torch.cuda.empty_cache()
    after = tt.stats()
    check(after["reserved_current"] + 64 * MiB <= before["reserved_current"],
          f"empty_cache: reserved {before['reserved_current'] / MiB:.1f} -> "
          f"{after['reserved_current'] / MiB:.1f} MiB")
    print(f"end: {fmt(after)}")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
