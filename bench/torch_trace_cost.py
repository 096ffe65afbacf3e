"""What one allocation and one free cost through PyTorch, allocator by
allocator, on the allocation sequence of a real workload: a bundled trace's
allocations and frees replayed through torch.cuda.caching_allocator_alloc
and caching_allocator_delete on the current stream (no kernels run, so every
free has completed by the next call). The Python loop costs the same under
every allocator; the differences between allocators are theirs. Each
allocator runs in its own process; rounds alternate the order.

  python3 bench/torch_trace_cost.py traces/gpt_train.csv.gz --rounds 3
"""
import argparse
import csv
import gzip
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = {"caching": None, "expandable": "expandable_segments:True",
        "tidepool": None, "none": None}


def load(path):
    ops = []
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        for row in csv.DictReader(f):
            if row["action"] == "alloc":
                ops.append((1, int(row["addr"]), int(row["size"])))
            elif row["action"] == "free_requested":
                ops.append((0, int(row["addr"]), 0))
    return ops


def child(name, path, passes):
    if name == "tidepool":
        sys.path.insert(0, os.path.join(REPO, "integrations", "pytorch"))
        import tidepool_torch
        tidepool_torch.install()
    import torch
    torch.cuda.init()
    ops = load(path)
    alloc, free = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    if name == "none":  # the loop alone: what every allocator's figure includes
        def alloc(size):
            return size

        def free(ptr):
            return None
    best = None
    for p in range(passes):
        live = {}
        n = 0
        t0 = time.perf_counter()
        for is_alloc, name_, size in ops:
            if is_alloc:
                live[name_] = alloc(size)
                n += 1
            else:
                ptr = live.pop(name_, None)
                if ptr is not None:
                    free(ptr)
                    n += 1
        for ptr in live.values():
            free(ptr)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if p > 0:  # the first pass grows the pool
            best = dt / n if best is None else min(best, dt / n)
    print("RESULT " + json.dumps({"allocator": name, "ns_per_op": 1e9 * best, "ops": n}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3, help="passes per process; the first is not timed")
    ap.add_argument("--allocators", default="none,caching,expandable,tidepool")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.trace, a.passes)
    names = a.allocators.split(",")
    res = {n: [] for n in names}
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if CONF[n]:
                env["PYTORCH_CUDA_ALLOC_CONF"] = CONF[n]
            out = subprocess.run([sys.executable, __file__, a.trace, "--child", n,
                                  "--passes", str(a.passes)],
                                 env=env, capture_output=True, text=True)
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
            if not line:
                print(f"{n}: no result\n{out.stderr[-2000:]}")
                continue
            v = json.loads(line[0][7:])
            res[n].append(v["ns_per_op"])
            print(f"[round {r + 1}] {n}: {v['ns_per_op']:.0f} ns per allocation or free "
                  f"({v['ops']} a pass)", flush=True)
    for n in names:
        if res[n]:
            print(f"{n:12s} best {min(res[n]):.0f} ns, rounds " +
                  " / ".join(f"{x:.0f}" for x in res[n]))


if __name__ == "__main__":
    sys.exit(main())
