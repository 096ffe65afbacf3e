#!/usr/bin/env python3
"""Step times of PyTorch allocators taken in lockstep: one process per
allocator, all alive at once, taking training steps in turn.

torch_train_bench.py runs one allocator per process, one after the other,
and on a shared VM a process's steps can run 10-20% slower than the next
process's for reasons that have nothing to do with its allocator. Here every
allocator's process trains the same model (torch_train_bench.py's GPT, same
seed, same shapes and batches) and the parent lets them take step i one
after the other, in an order that rotates with i, before any takes step
i + 1. Only one process works at a time (each synchronizes at its step's
end), all on the same CPUs, so each step of one allocator is set against the
same step of the others, taken a few hundred milliseconds apart. The parent
prints each allocator's median step, the median over steps of its per-step
ratio to a reference allocator with a 95% interval (a bootstrap over runs
of 20 steps), its memory and whether the losses are identical step by step.
The allocator "null" (--null-lib, bench/null_alloc/null_alloc.c) is PyTorch's
pluggable-allocator path with almost nothing behind it: what that path
costs whatever the allocator. "null/vmm" and "null/vmm1" are the same with
blocks of 1 MiB and more made of the driver's virtual memory instead of
cuMemAlloc (2 MiB physical chunks each made on its own, as tidepool and
expandable_segments make them; or one physical allocation a block): what
the GPU's work costs on such memory, without any allocator's host time.
Each allocator's "host ms" is the median time its steps took to queue their
work (before the loss is waited for): near the step's time, the step is
bound by the host. "cpu ms" is the median CPU time the stepping thread used
while it queued the step: the allocator's own calls and what they cost
PyTorch's work around them (cache misses), and any time a full queue made
the driver spin.

    python3 bench/torch_lockstep.py --allocators expandable,tidepool,tidepool/25000 \\
        --steps 300 --pin 2-5 [--lib build/libtidepool.so] [--reference expandable]

--model hf-bert (or hf-gpt2) trains a model of the transformers package
instead, built from a config of the same size with random weights.

Needs PyTorch and a GPU (and transformers for the hf- models).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_train_bench as ttb  # noqa: E402  (the model, shapes, allocators)

MiB = 1 << 20


def child(args):
    """Builds the model as torch_train_bench's child does, then takes one
    step per "STEP" line on stdin and answers "T seconds loss"; "END"
    answers with the memory figures."""
    cfg = json.loads(args.config)
    if args.pin:
        os.sched_setaffinity(0, ttb.parse_cpus(args.pin))
    tidepool = ttb.base(args.child) == "tidepool"
    if tidepool:
        sys.path.insert(0, os.path.join(ttb.REPO, "integrations", "pytorch"))
        import tidepool_torch
        tidepool_torch.install()
    import torch
    if ttb.base(args.child) == "null":
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(
                os.environ["TORCH_NULL_ALLOC"], "null_alloc", "null_free"))

    device = torch.device("cuda")
    torch.cuda.init()
    model, opt, next_batch = ttb.training(torch, cfg, device)
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "END":
            break
        b, t, idx = next_batch()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        loss = ttb.train_step(torch, model, opt, idx, device, True, cfg["vocab"])
        queued = time.perf_counter() - t0
        cpu = time.thread_time() - c0
        value = loss.item()
        torch.cuda.synchronize()
        print(f"T {time.perf_counter() - t0:.9f} {value!r} {b} {t} {queued:.9f} {cpu:.9f}",
              flush=True)
    out = {"backend": torch.cuda.get_allocator_backend()}
    if ttb.base(args.child) == "null":
        out.update(reserved=0, allocated=0)
    elif tidepool:
        st = tidepool_torch.stats()
        out.update(reserved=st["reserved_peak"], allocated=st["used_peak"])
        m = tidepool_torch.chunk_maps()
        out.update(maps=m["maps"], unmaps=m["unmaps"])
    else:
        out.update(reserved=torch.cuda.max_memory_reserved(),
                   allocated=torch.cuda.max_memory_allocated())
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def bootstrap_median(values, block=20, rounds=2000, seed=7):
    """A 95% interval of the median, by resampling runs of `block`
    consecutive steps: neighbouring steps are not independent (a slow
    stretch of the VM slows several), and resampling single steps would
    give an interval too narrow."""
    rng = random.Random(seed)
    blocks = [values[i:i + block] for i in range(0, len(values), block)]
    meds = sorted(statistics.median([v for b in rng.choices(blocks, k=len(blocks))
                                     for v in b]) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds) - 1]


def parent(args):
    cfg = dict(vocab=32000, d_model=768, layers=12, heads=12, shapes=ttb.SHAPES,
               seed=args.seed, dropout=0.1, amp=True, device="cuda",
               model=args.model)
    names = args.allocators.split(",")
    ref = args.reference or names[0]
    if ref not in names:
        sys.exit(f"the reference {ref!r} is not among the allocators")
    procs = {}
    for n in names:
        if ttb.base(n) == "null":
            if not args.null_lib:
                sys.exit("the null allocator needs --null-lib")
            if n not in ("null", "null/vmm", "null/vmm1"):
                sys.exit(f"unknown allocator {n!r}")
            env, why = ttb.child_env("caching", args)
            env["TORCH_NULL_ALLOC"] = os.path.abspath(args.null_lib)
            env["TORCH_NULL_FRESH"] = n.partition("/")[2] or "alloc"
        elif ttb.base(n) not in ttb.ALLOCATORS:
            sys.exit(f"unknown allocator {n!r}")
        else:
            env, why = ttb.child_env(n, args)
        if why:
            sys.exit(f"{n}: {why}")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", n,
               "--config", json.dumps(cfg)] + (["--pin", args.pin] if args.pin else [])
        procs[n] = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, bufsize=1)
    for n, p in procs.items():
        for line in p.stdout:
            if line.startswith("READY"):
                break
        else:
            sys.exit(f"{n}: the child ended before it was ready")
    facts = ttb.gpu_facts()
    print(f"== torch_lockstep: model {args.model}, {len(names)} allocators in lockstep, "
          f"{args.steps} steps, warm-up {args.warmup}, GPU {facts}, "
          f"pinned to {args.pin or 'no CPUs'}",
          flush=True)

    times = {n: [] for n in names}
    queued = {n: [] for n in names}
    cpus = {n: [] for n in names}
    losses = {n: [] for n in names}
    shapes = []
    for i in range(args.steps):
        order = names[i % len(names):] + names[:i % len(names)]
        for n in order:
            p = procs[n]
            p.stdin.write("STEP\n")
            p.stdin.flush()
            line = p.stdout.readline()
            while line and not line.startswith("T "):  # other output passes
                line = p.stdout.readline()
            if not line:
                sys.exit(f"{n}: step {i}: the child ended without an answer")
            _, sec, loss, b, t, q, c = line.split()
            times[n].append(float(sec))
            queued[n].append(float(q))
            cpus[n].append(float(c))
            losses[n].append(loss)
            if n == ref:
                shapes.append((int(b), int(t)))
    results = {}
    for n, p in procs.items():
        p.stdin.write("END\n")
        p.stdin.flush()
        for line in p.stdout:
            if line.startswith("RESULT "):
                results[n] = json.loads(line[len("RESULT "):])
        p.wait()

    w = args.warmup
    print(f"\n{'allocator':<16} {'backend':<16} {'median ms':>9} {'vs ' + ref:>14} "
          f"{'95% interval':>16} {'res/alloc':>9} {'host ms':>8} {'cpu ms':>7}  losses")
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": facts,
              "model": args.model, "steps": args.steps, "warmup": w,
              "reference": ref, "pin": args.pin,
              "allocators": {}}
    for n in names:
        ts = times[n][w:]
        ratios = [a / b for a, b in zip(ts, times[ref][w:])]
        med = statistics.median(ratios)
        lo, hi = bootstrap_median(ratios)
        r = results.get(n, {})
        mem = r["reserved"] / r["allocated"] if r.get("allocated") else 0.0
        same = "identical" if losses[n] == losses[ref] else "DIFFER"
        host = 1e3 * statistics.median(queued[n][w:])
        cpu = 1e3 * statistics.median(cpus[n][w:])
        print(f"{n:<16} {r.get('backend', '?'):<16} {1e3 * statistics.median(ts):>9.2f} "
              f"{med:>13.4f}x {lo:>7.4f}-{hi:.4f}x {mem:>9.4f} {host:>8.2f} {cpu:>7.2f}  {same}")
        entry = {"median_ms": 1e3 * statistics.median(ts), "host_ms": host, "cpu_ms": cpu,
                 "ratio_median": med,
                 "ratio_ci95": [lo, hi], "reserved": r.get("reserved"),
                 "allocated": r.get("allocated"), "losses_identical": same == "identical"}
        if "maps" in r:
            entry.update(maps=r["maps"], unmaps=r["unmaps"])
        report["allocators"][n] = entry
    # Halves: whether the ratio drifts over the run.
    half = w + (args.steps - w) // 2
    print("ratio to " + ref + " by half (steps after warm-up): " + "; ".join(
        f"{n} {statistics.median([a / b for a, b in zip(times[n][w:half], times[ref][w:half])]):.4f}"
        f" / {statistics.median([a / b for a, b in zip(times[n][half:], times[ref][half:])]):.4f}"
        for n in names if n != ref))
    print("JSON " + json.dumps(report, separators=(",", ":")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(report, times=times, queued=queued, cpu=cpus, shapes=shapes), f)
    return 0 if all(losses[n] == losses[ref] for n in names) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocators", default="expandable,tidepool",
                    help="comma-separated, as torch_train_bench.py names them")
    ap.add_argument("--reference", help="the allocator the ratios are to (default the first)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--model", default="gpt", choices=ttb.MODELS,
                    help="what every child trains (torch_train_bench.py's MODELS)")
    ap.add_argument("--pin", help="CPUs for every child, e.g. 2-5")
    ap.add_argument("--lib", help="libtidepool.so for tidepool's children")
    ap.add_argument("--lib2", help="a second libtidepool.so, for the children named "
                    "tidepool/lib2")
    ap.add_argument("--json", help="also write every step's time here")
    ap.add_argument("--null-lib", help="bench/null_alloc/null_alloc.c built as a shared "
                    "library: the allocator \"null\", PyTorch's pluggable path "
                    "with almost no allocator behind it")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
