#!/usr/bin/env python3
"""PyTorch's memory calls, answered by the driver and by tidepool, compared.

One script of PyTorch calls with backend:cudaMallocAsync (tensors on several
streams with their values checked, record_stream, the allocator's
statistics and their resets, empty_cache, out of memory, the memory
fraction, caching_allocator_alloc, CUDA graphs: captured, replayed, sharing
a pool, in the three capture modes; threads with
streams of their own) runs twice,
each time in a process of its own: natively, then under tidepool-run. Every
step's outcome (its value, or the error it raised) goes into one JSON line;
the parent prints the steps whose outcomes differ and exits 1 if any does.
Reserved memory, which tidepool keeps lower on purpose, is compared only as
relations (reserved >= allocated, lower after empty_cache).

    python3 bench/torch_differential.py --run build/tidepool-run [--all]

Needs a GPU and PyTorch.
"""

import argparse
import json
import os
import subprocess
import sys
import threading

MiB = 1 << 20


def child():
    import torch
    out = {}

    def step(name, fn):
        try:
            v = fn()
            if not isinstance(v, (int, float, str, bool, list, type(None))):
                v = type(v).__name__
            out[name] = ["ok", v]
            return v
        except Exception as e:  # the outcome is what is compared
            # An out-of-memory message carries figures of the moment.
            text = str(e).splitlines()[0][:120] if str(e) else ""
            if isinstance(e, torch.OutOfMemoryError):
                text = ""
            out[name] = ["error", type(e).__name__, text]
            return None
        finally:
            # PyTorch's own count after each step, as the allocator's
            # answers moved it.
            try:
                out[name].append(torch.cuda.memory_allocated())
            except Exception:  # the count itself is unavailable
                out[name].append(None)
            print("RESULT " + json.dumps(out), flush=True)

    dev = torch.device("cuda")
    cuda = torch.cuda
    step("backend", cuda.get_allocator_backend)
    step("allocated at the start", cuda.memory_allocated)

    # -- tensors and statistics --------------------------------------------
    keep = []

    def allocate():
        for n in (1, 255, 4096, MiB + 7, 64 * MiB):
            keep.append(torch.empty(n, dtype=torch.uint8, device=dev))
        return cuda.memory_allocated()

    step("allocated after five tensors", allocate)
    step("reserved >= allocated",
         lambda: cuda.memory_reserved() >= cuda.memory_allocated())
    step("peak allocated", cuda.max_memory_allocated)

    def values():
        x = torch.arange(1 << 20, device=dev, dtype=torch.float64)
        return float((x * 2).sum())

    step("values", values)
    step("freed", lambda: (keep.clear(), cuda.synchronize(),
                           cuda.memory_allocated())[2])

    def reset_peak():
        cuda.reset_peak_memory_stats()
        return cuda.max_memory_allocated() == cuda.memory_allocated()

    step("peak reset to current", reset_peak)
    step("statistics keys", lambda: sorted(cuda.memory_stats().keys()))
    step("allocation counts",
         lambda: [cuda.memory_stats().get(k) for k in
                  ("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                   "num_device_alloc", "num_device_free")])

    def empty_cache():
        big = [torch.empty(32 * MiB, dtype=torch.uint8, device=dev)
               for _ in range(8)]
        del big
        cuda.synchronize()
        before = cuda.memory_reserved()
        cuda.empty_cache()
        return cuda.memory_reserved() <= before

    step("empty_cache lowers reserved", empty_cache)

    # -- streams -------------------------------------------------------------
    def side_stream():
        s = cuda.Stream()
        with cuda.stream(s):
            a = torch.full((4 * MiB,), 3.0, device=dev)
            b = a + 1
        s.synchronize()
        return float(b.sum())

    step("work on a side stream", side_stream)

    def record_stream():
        # A tensor used on a side stream and freed on the main one: its
        # memory must not be given out before the side stream's work.
        s = cuda.Stream()
        results = []
        for _ in range(20):
            x = torch.full((8 * MiB,), 1.0, device=dev)
            s.wait_stream(cuda.current_stream())
            with cuda.stream(s):
                cuda._sleep(2_000_000)
                y = x * 2
            x.record_stream(s)
            del x
            z = torch.full((8 * MiB,), 5.0, device=dev)  # may reuse x later
            s.synchronize()
            results.append(float(y[0]))
            del y, z
        return sorted(set(results))

    step("record_stream keeps memory until the side stream is done",
         record_stream)

    def threads():
        wrong = []

        def work(i):
            try:
                s = cuda.Stream()
                with cuda.stream(s):
                    for k in range(30):
                        a = torch.ones((64 + i, 64 + k), device=dev)
                        c = a @ a.t()
                        if float(c[0, 0]) != 64 + k:
                            wrong.append((i, k))
                s.synchronize()
            except Exception as e:  # reported, and compared
                wrong.append(repr(e))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return wrong[:3]

    step("8 threads on streams of their own", threads)

    # -- out of memory ---------------------------------------------------------
    step("1 PiB", lambda: torch.empty(1 << 50, dtype=torch.uint8, device=dev))
    step("allocation after out of memory",
         lambda: float(torch.ones(1024, device=dev).sum()))
    step("num_ooms", lambda: cuda.memory_stats().get("num_ooms"))

    def fraction():
        free, total = cuda.mem_get_info()
        cuda.set_per_process_memory_fraction(0.25)
        try:
            try:
                torch.empty(int(total * 0.5), dtype=torch.uint8, device=dev)
                r = "allocated"
            except torch.OutOfMemoryError:
                r = "out of memory"
            small = torch.empty(int(total * 0.05), dtype=torch.uint8,
                                device=dev)
            del small
        finally:
            cuda.set_per_process_memory_fraction(1.0)
        return r

    step("memory fraction 0.25, half the card", fraction)
    step("mem_get_info: free <= total",
         lambda: (lambda f, t: f <= t)(*cuda.mem_get_info()))

    def raw():
        p = cuda.caching_allocator_alloc(MiB, 0, cuda.current_stream())
        cuda.caching_allocator_delete(p)
        return p != 0

    step("caching_allocator_alloc and delete", raw)

    # -- graphs ----------------------------------------------------------------
    def graph(mode):
        static_in = torch.randn(256, 256, device=dev)
        w = torch.randn(256, 256, device=dev)
        s = cuda.Stream()
        s.wait_stream(cuda.current_stream())
        with cuda.stream(s):
            for _ in range(2):
                (static_in @ w).relu().sum()
        cuda.current_stream().wait_stream(s)
        g = cuda.CUDAGraph()
        with cuda.graph(g, capture_error_mode=mode):
            h = (static_in @ w).relu()
            static_out = h.sum() + (h * 2).mean()
        ok = []
        for _ in range(5):
            static_in.copy_(torch.randn(256, 256, device=dev))
            g.replay()
            h = (static_in @ w).relu()
            ok.append(bool(torch.allclose(static_out, h.sum() + (h * 2).mean(),
                                          rtol=1e-4)))
        del g, static_out
        cuda.synchronize()
        return all(ok)

    for mode in ("global", "thread_local", "relaxed"):
        step(f"graph in {mode} mode replayed 5 times",
             lambda m=mode: graph(m))

    def shared_pool():
        a = torch.ones(1024, device=dev)
        g1, g2 = cuda.CUDAGraph(), cuda.CUDAGraph()
        with cuda.graph(g1):
            b = a * 2
        with cuda.graph(g2, pool=g1.pool()):
            c = b + 1
        for _ in range(3):
            g1.replay()
            g2.replay()
        cuda.synchronize()
        r = [float(b.sum()), float(c.sum())]
        del g1, g2, b, c
        return r

    step("two graphs sharing a pool", shared_pool)

    cuda.synchronize()
    step("allocated at the end", cuda.memory_allocated)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="tidepool-run")
    ap.add_argument("--all", action="store_true",
                    help="print the steps that agree too")
    args = ap.parse_args()
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    res = {}
    for name, pre in (("driver", []), ("tidepool", [args.run])):
        p = subprocess.run(pre + [sys.executable, __file__, "--child"],
                           capture_output=True, text=True, timeout=900, env=env)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0:
            print(f"{name}: exit {p.returncode}\n{p.stderr[-1500:]}")
        if not line:
            return 1
        res[name] = json.loads(line[-1][len("RESULT "):])
        res[name]["exit status of the process"] = ["ok", p.returncode]
    keys = list(res["driver"]) + [k for k in res["tidepool"]
                                  if k not in res["driver"]]
    differ = 0
    for k in keys:
        d, t = res["driver"].get(k), res["tidepool"].get(k)
        if d != t:
            differ += 1
            print(f"DIFF {k}: driver {json.dumps(d)} | tidepool {json.dumps(t)}")
        elif args.all:
            print(f"same {k}: {json.dumps(d)}")
    print(f"{len(keys)} steps, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()
        sys.exit(0)
    sys.exit(main())
