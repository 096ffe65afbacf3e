#!/usr/bin/env python3
"""torch.cuda.graph with tidepool as PyTorch's CUDA allocator.

Installs tidepool through tidepool_torch, then captures a small model's
forward and backward pass with torch.cuda.graph (in each capture error
mode), replays it with new inputs and compares every replay with the same
step run eagerly; captures a second graph into the first one's pool; lets
an output outlive its graph; and runs all of it twice, checking that the
second round leaves no more bytes in use than the first (in the pool and,
under tidepool, in graph memory). Where
PyTorch or a CUDA device is absent it prints SKIP and exits 0. Exit 1 on any
failure.

    TIDEPOOL_LIB=build/libtidepool.so python3 integrations/pytorch/test_graph.py

With --native the same checks run on PyTorch's own allocator (the pool
checks then read torch.cuda.memory_allocated), to tell PyTorch's answers
from tidepool's.
"""

import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish, skip  # noqa: E402


def main():
    try:
        import torch
    except ImportError:
        skip("PyTorch is not installed here")
    if not torch.cuda.is_available():
        skip(f"PyTorch {torch.__version__} sees no CUDA device")

    native = "--native" in sys.argv[1:]
    if native:
        def used_now():
            return torch.cuda.memory_allocated()
        print("native: PyTorch's own allocator")
    else:
        import tidepool_torch as tt

        print(f"tidepool {tt.install()}")

        import ctypes
        lib = ctypes.CDLL(tt.library_path())

        def graph_used():
            v = ctypes.c_uint64(0)
            err = lib.tp_device_get_graph_mem_attribute(
                torch.cuda.current_device(), 0, ctypes.byref(v))
            return v.value if err == 0 else -err

        def used_now():
            return (tt.stats()["used_current"], graph_used())
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    # What PyTorch itself keeps after the first round (natively too) stays;
    # a second round must not add to it.
    # One side stream for every warm-up: PyTorch keeps a cuBLAS workspace
    # for each stream it has seen, which a new stream a round would add.
    side = torch.cuda.Stream()
    after = []
    for _ in range(2):
        scenarios(torch, side)
        gc.collect()
        torch.cuda.synchronize()
        after.append(used_now())
    check(after[1] == after[0],
          f"a second round keeps no more bytes in use ({after[1]} against "
          f"{after[0]})")

    return finish()


def scenarios(torch, side):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 16)).cuda()

    def step(x):
        for p in model.parameters():
            p.grad = None
        out = model(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        return out, loss, [p.grad for p in model.parameters()]

    def eager(x):
        out, loss, grads = step(x)
        return out.clone(), loss.clone(), [g.clone() for g in grads]

    def same(a, b):
        return torch.equal(a, b)

    for mode in ("global", "thread_local", "relaxed"):
        static_x = torch.randn(64, 256, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up, as PyTorch's docs ask
            for _ in range(3):
                step(static_x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode=mode):
            s_out, s_loss, s_grads = step(static_x)
        ok = True
        for i in range(20):
            x = torch.randn(64, 256, device="cuda")
            static_x.copy_(x)
            g.replay()
            torch.cuda.synchronize()
            r_out, r_loss, r_grads = eager(x)
            ok = ok and same(s_out, r_out) and same(s_loss, r_loss) and all(
                same(a, b) for a, b in zip(s_grads, r_grads))
        check(ok, f"capture mode {mode}: 20 replays equal the eager step")
        del g, s_out, s_loss, s_grads, static_x
        torch.cuda.synchronize()

    # Two graphs in one pool, replayed in turn.
    xa = torch.randn(32, 256, device="cuda")
    xb = torch.randn(48, 256, device="cuda")
    with torch.no_grad():
        ga = torch.cuda.CUDAGraph()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(xa)
            model(xb)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(ga):
            ya = model(xa) * 2
        gb = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gb, pool=ga.pool()):
            yb = model(xb) + 1
        ok = True
        for _ in range(10):
            xa.normal_()
            xb.normal_()
            ga.replay()
            gb.replay()
            torch.cuda.synchronize()
            ok = ok and same(ya, model(xa) * 2) and same(yb, model(xb) + 1)
        check(ok, "two graphs sharing a pool: 10 replays each equal eager")

        # An output that outlives its graph stays readable and is freed
        # when its tensor goes.
        kept = ya.clone()
        del ga, gb
        torch.cuda.synchronize()
        check(same(ya, kept), "an output read after its graph was destroyed")
        del ya, yb, kept, xa, xb
    torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
