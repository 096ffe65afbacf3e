"""What one allocation and one free cost through PyTorch, allocator by
allocator, on the allocation sequence of a real workload: a bundled trace's
allocations and frees replayed through torch.cuda.caching_allocator_alloc
and caching_allocator_delete on the current stream (no kernels run, so every
free has completed by the next call). The Python loop costs the same under
every allocator; the differences between allocators are theirs. Each
allocator runs in its own process; rounds alternate the order.

  python3 bench/torch_trace_cost.py traces/gpt_train.csv.gz --rounds 3
  python3 bench/torch_trace_cost.py traces/gpt_train.csv.gz \
      --allocators expandable,tidepool,tidepool/25000 --pin 2-5

tidepool/N is tidepool with the growth slack N (parts per million). Under
tidepool the time spent inside tidepool's entry points is printed too
(TIDEPOOL_TORCH_TIMING), which tells PyTorch's share of a call from
tidepool's.
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
    tidepool_torch = None
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
    best, inside = None, None
    for p in range(passes):
        before = tidepool_torch.timing() if tidepool_torch else None
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
        if p > 0 and (best is None or dt / n < best):  # the first pass grows the pool
            best = dt / n
            if tidepool_torch:
                after = tidepool_torch.timing()
                inside = (after["alloc_ns"] + after["free_ns"] - before["alloc_ns"]
                          - before["free_ns"]) / n
    print("RESULT " + json.dumps({"allocator": name, "ns_per_op": 1e9 * best, "ops": n,
                                  "ns_inside_tidepool": inside}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3, help="passes per process; the first is not timed")
    ap.add_argument("--allocators", default="none,caching,expandable,tidepool")
    ap.add_argument("--pin", help="CPUs every process is bound to, e.g. 2-5")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        if a.pin:
            cpus = set()
            for part in a.pin.split(","):
                lo, _, hi = part.partition("-")
                cpus.update(range(int(lo), int(hi or lo) + 1))
            os.sched_setaffinity(0, cpus)
        return child(a.child.split("/", 1)[0], a.trace, a.passes)
    names = a.allocators.split(",")
    for n in names:
        kind, _, slack = n.partition("/")
        if kind not in CONF or (slack and (kind != "tidepool" or not slack.isdigit())):
            sys.exit(f"unknown allocator {n!r}; known: {', '.join(CONF)}, tidepool/SLACK")
    res = {n: [] for n in names}
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            kind, _, slack = n.partition("/")
            if CONF[kind]:
                env["PYTORCH_CUDA_ALLOC_CONF"] = CONF[kind]
            if kind == "tidepool":
                env["TIDEPOOL_TORCH_TIMING"] = "1"
                if slack:
                    env["TIDEPOOL_TORCH_GROWTH_SLACK"] = slack
            out = subprocess.run([sys.executable, __file__, a.trace, "--child", n,
                                  "--passes", str(a.passes)]
                                 + (["--pin", a.pin] if a.pin else []),
                                 env=env, capture_output=True, text=True)
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
            if not line:
                print(f"{n}: no result\n{out.stderr[-2000:]}")
                continue
            v = json.loads(line[0][7:])
            res[n].append(v["ns_per_op"])
            inside = v.get("ns_inside_tidepool")
            print(f"[round {r + 1}] {n}: {v['ns_per_op']:.0f} ns per allocation or free "
                  f"({v['ops']} a pass)"
                  + (f", {inside:.0f} ns of it inside tidepool" if inside else ""), flush=True)
    for n in names:
        if res[n]:
            print(f"{n:12s} best {min(res[n]):.0f} ns, rounds " +
                  " / ".join(f"{x:.0f}" for x in res[n]))


if __name__ == "__main__":
    sys.exit(main())
