#!/usr/bin/env python3
"""The zero-code path on a GPU, side by side in one run: PyTorch training with
backend:cudaMallocAsync on the driver's pool and under tidepool-run (tidepool
answering the runtime's allocator calls), PyTorch running out of memory under
tidepool-run, and CuPy's MemoryAsyncPool under tidepool-run. Each runs in a
process of its own; the parent checks every result and prints a table.

    python3 bench/gpu_preload.py --run build/tidepool-run [--steps N] [--json F]

Checked under tidepool-run: the interposer is on (cuda) and answered the
allocations; torch.cuda.memory_stats(), max_memory_reserved() and
memory_reserved() equal tidepool's own figures of the pool (asked from the
interposer directly, through tidepool_preload_pool_stats); reset_peak_memory_
stats() and empty_cache() act on tidepool's pool; the losses equal the
driver's step for step. Out of memory: a request larger than the card and
filling the card both raise torch.OutOfMemoryError, and training goes on
after the memory is freed. CuPy (whose wheels link the CUDA runtime
statically, so that only the interposer's driver-level layer sees its calls):
MemoryAsyncPool's allocations counted through tidepool's own pool figures
(used and reserved while CuPy's arrays live, and after they are freed) and
the interposer's counters; CuPy's used_bytes() and total_bytes() equal
tidepool's figures. Stream capture (backend:cudaMallocAsync captures
cudaMallocAsync): a small model's forward and backward captured in
torch.cuda.graph, replayed --replays times, each replay's loss and gradients
compared with eager mode's on the same input, on the driver's graph memory
and under tidepool-run, where every allocation during capture is tidepool's
(none forwarded) and counted as graph memory; the graph memory still in use
once the graph and its outputs are gone is reported (graph_used_after).

The model is bench/torch_train_bench.py's GPT-style decoder, smaller.
"""

import argparse
import ctypes
import glob
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
GiB = 1 << 30
MiB = 1 << 20

CFG = dict(vocab=8192, d_model=512, layers=6, heads=8, dropout=0.0,
           shapes=[(8, 128), (16, 256), (4, 512), (32, 64), (2, 1024),
                   (12, 384)],
           seed=1234)


# ---------------------------------------------------------------------------
# Children
# ---------------------------------------------------------------------------

class Preload:
    """The interposer's diagnostics, from the process's global scope."""

    def __init__(self):
        lib = ctypes.CDLL(None)
        try:
            self.mode_fn = lib.tidepool_preload_mode
            self.counter_fn = lib.tidepool_preload_counter
            self.stats_fn = lib.tidepool_preload_pool_stats
        except AttributeError:
            self.mode_fn = None
            return
        self.counter_fn.restype = ctypes.c_ulonglong
        self.counter_fn.argtypes = [ctypes.c_int]
        self.stats_fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong)]

    def loaded(self):
        return self.mode_fn is not None

    def mode(self):
        names = {0: "undecided", 1: "off", 2: "cuda", 3: "host"}
        return names.get(self.mode_fn(), "?") if self.mode_fn else "not loaded"

    def counters(self):
        names = ["mallocs", "frees", "pool_calls", "forwarded", "syncs",
                 "events", "failed", "driver_level"]
        if not self.mode_fn:
            return {}
        return {n: int(self.counter_fn(i)) for i, n in enumerate(names)}

    def stats(self, device=0):
        """reserved, reserved peak, used, used peak: tidepool's own."""
        out = (ctypes.c_ulonglong * 4)()
        rc = self.stats_fn(device, out)
        if rc != 0:
            raise RuntimeError(f"tidepool_preload_pool_stats: error {rc}")
        return [int(v) for v in out]


def train_steps(torch, model, opt, data, pick, steps, cfg):
    F = torch.nn.functional
    losses, times = [], []
    for _ in range(steps):
        b, t = pick.choice(cfg["shapes"])
        idx = torch.randint(cfg["vocab"], (b, t + 1), generator=data)
        t0 = time.perf_counter()
        x = idx[:, :-1].to("cuda")
        y = idx[:, 1:].to("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return losses, times


def setup(torch, cfg):
    from torch_train_bench import build_model
    torch.manual_seed(cfg["seed"])
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build_model(torch, cfg).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.Generator().manual_seed(cfg["seed"] + 1)
    pick = random.Random(cfg["seed"] + 2)
    return model, opt, data, pick


def torch_figures(torch):
    ms = torch.cuda.memory_stats()
    return [ms.get("reserved_bytes.all.current", -1),
            ms.get("reserved_bytes.all.peak", -1),
            ms.get("allocated_bytes.all.current", -1),
            ms.get("allocated_bytes.all.peak", -1)]


def child_train(args):
    import torch
    pre = Preload()
    cfg = dict(CFG)
    model, opt, data, pick = setup(torch, cfg)
    losses, times = train_steps(torch, model, opt, data, pick, args.steps, cfg)
    r = {"losses": losses, "times_s": times,
         "backend": torch.cuda.get_allocator_backend(),
         "peak_reserved": torch.cuda.max_memory_reserved(),
         "peak_allocated": torch.cuda.max_memory_allocated(),
         "mode": pre.mode(), "checks": {}}
    checks = r["checks"]
    if pre.loaded() and pre.mode() == "cuda":
        theirs, ours = torch_figures(torch), pre.stats()
        r["torch_stats"], r["tidepool_stats"] = theirs, ours
        checks["memory_stats == tidepool's figures"] = theirs == ours
        checks["max_memory_reserved == tidepool's peak"] = (
            torch.cuda.max_memory_reserved() == ours[1])
        checks["memory_reserved == tidepool's reserved"] = (
            torch.cuda.memory_reserved() == ours[0])
        torch.cuda.reset_peak_memory_stats()
        after = pre.stats()
        checks["reset_peak_memory_stats resets tidepool's peaks"] = (
            after[1] == after[0] and after[3] == after[2])
        before = after[0]
        torch.cuda.empty_cache()
        trimmed = pre.stats()
        r["reserved_before_empty_cache"] = before
        r["reserved_after_empty_cache"] = trimmed[0]
        checks["empty_cache trims tidepool's pool"] = (
            trimmed[0] < before and torch.cuda.memory_reserved() == trimmed[0])
        r["counters"] = pre.counters()
        checks["tidepool answered the allocations"] = (
            r["counters"]["mallocs"] > 0 and r["counters"]["frees"] > 0)
    print("RESULT " + json.dumps(r), flush=True)
    return 0


def child_oom(args):
    import torch
    pre = Preload()
    cfg = dict(CFG)
    model, opt, data, pick = setup(torch, cfg)
    r = {"mode": pre.mode(), "checks": {}}
    checks = r["checks"]
    losses, _ = train_steps(torch, model, opt, data, pick, 5, cfg)
    total = torch.cuda.get_device_properties(0).total_memory

    # 1. One request larger than the card.
    try:
        x = torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        del x
        checks["a request larger than the card raises OutOfMemoryError"] = False
    except torch.OutOfMemoryError:
        checks["a request larger than the card raises OutOfMemoryError"] = True

    # 2. Filling the card block by block until the memory runs out.
    blocks, raised, t0 = [], False, time.time()
    try:
        while len(blocks) < 2 * total // (4 * GiB) + 2:
            blocks.append(torch.empty(4 * GiB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        raised = True
    r["filled_gib"] = 4 * len(blocks)
    r["fill_s"] = time.time() - t0
    checks["filling the card raises OutOfMemoryError"] = raised
    if pre.loaded() and pre.mode() == "cuda":
        r["reserved_when_full"] = pre.stats()[0]
    del blocks
    torch.cuda.empty_cache()

    # 3. Training goes on.
    more, _ = train_steps(torch, model, opt, data, pick, 5, cfg)
    checks["training goes on after out-of-memory"] = all(
        math.isfinite(v) for v in losses + more)
    if pre.loaded() and pre.mode() == "cuda":
        r["counters"] = pre.counters()
        checks["tidepool answered the allocations"] = r["counters"]["mallocs"] > 0
        checks["out-of-memory answered by tidepool"] = r["counters"]["failed"] >= 2
    print("RESULT " + json.dumps(r), flush=True)
    return 0


def cupy_links_runtime_statically(cupy):
    """True when CuPy's runtime module carries the CUDA runtime inside itself
    (no libcudart among its needed libraries)."""
    base = os.path.dirname(os.path.dirname(cupy.__file__))
    mods = glob.glob(os.path.join(base, "cupy_backends", "cuda", "api", "runtime*.so"))
    if not mods:
        return None
    with open(mods[0], "rb") as f:
        return b"libcudart.so" not in f.read()


def child_cupy(args):
    pre = Preload()
    r = {"checks": {}}
    checks = r["checks"]
    try:
        import cupy
    except ImportError as e:
        r["skipped"] = f"cupy not importable: {e}"
        r["mode"] = pre.mode()
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    r["cupy"] = cupy.__version__
    r["static_runtime"] = cupy_links_runtime_statically(cupy)
    before = pre.counters() if pre.loaded() else {}
    pool = cupy.cuda.MemoryAsyncPool()
    cupy.cuda.set_allocator(pool.malloc)
    a = cupy.random.random((4096, 4096), dtype=cupy.float32)
    b = a @ a
    total = float(b.sum())
    cupy.cuda.Stream.null.synchronize()
    live = a.nbytes + b.nbytes
    r["live_bytes"] = live
    r["cupy_used_bytes"] = int(pool.used_bytes())
    r["cupy_total_bytes"] = int(pool.total_bytes())
    r["mode"] = pre.mode()
    on = pre.loaded() and r["mode"] == "cuda"
    if on:
        held = pre.stats()
        r["tidepool_stats"] = held
        checks["tidepool's pool holds CuPy's arrays"] = held[2] >= live
        checks["CuPy's used_bytes() is tidepool's used"] = (
            r["cupy_used_bytes"] == held[2])
        checks["CuPy's total_bytes() is tidepool's reserved"] = (
            r["cupy_total_bytes"] == held[0])
    del a, b
    pool.free_all_blocks()
    cupy.cuda.Stream.null.synchronize()
    if on:
        freed = pre.stats()
        r["tidepool_stats_after_free"] = freed
        checks["freeing the arrays returns them to tidepool's pool"] = (
            freed[2] <= held[2] - live)
        checks["free_all_blocks() trims tidepool's pool"] = (
            freed[0] < held[0] and freed[0] == int(pool.total_bytes()))
    after = pre.counters() if pre.loaded() else {}
    r["counters"] = after
    r["answered_mallocs"] = after.get("mallocs", 0) - before.get("mallocs", 0)
    r["driver_level_calls"] = (after.get("driver_level", 0) -
                               before.get("driver_level", 0))
    checks["computed"] = math.isfinite(total)
    r["routed"] = r["answered_mallocs"] > 0
    if on:
        checks["tidepool answered CuPy's allocations"] = r["routed"]
        if r.get("static_runtime"):
            checks["through the driver's entry points"] = (
                r["driver_level_calls"] >= r["answered_mallocs"] > 0)
    print("RESULT " + json.dumps(r), flush=True)
    return 0


class GraphMem:
    """A device's graph memory: through the runtime's name (under
    tidepool-run, the interposer's: the driver's and tidepool's together)
    and the driver's name looked up in libcuda (without the interposer the
    driver's own; under tidepool-run the interposer's too, since it wraps
    the driver names that dlsym finds)."""

    def __init__(self):
        args = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_ulonglong)]
        # Without the interposer the runtime is torch's, loaded privately:
        # the driver's figure is then the whole of it.
        self.rt = getattr(ctypes.CDLL(None), "cudaDeviceGetGraphMemAttribute",
                          None)
        if self.rt:
            self.rt.argtypes = args
        self.drv = ctypes.CDLL("libcuda.so.1").cuDeviceGetGraphMemAttribute
        self.drv.argtypes = args

    def get(self, attr):
        """(all, driver's own) for attr 0 used, 1 used high, 2 reserved,
        3 reserved high, on device 0."""
        a, d = ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)
        if self.drv(0, attr, ctypes.byref(d)) != 0:
            raise RuntimeError("cuDeviceGetGraphMemAttribute failed")
        if not self.rt:
            return int(d.value), int(d.value)
        if self.rt(0, attr, ctypes.byref(a)) != 0:
            raise RuntimeError("cudaDeviceGetGraphMemAttribute failed")
        return int(a.value), int(d.value)


def child_graph(args):
    """A small model's forward and backward captured in torch.cuda.graph and
    replayed, each replay's loss and gradients compared with eager mode's on
    the same input."""
    import gc
    import torch
    pre = Preload()
    F = torch.nn.functional
    torch.manual_seed(7)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    d = 256
    model = torch.nn.Sequential(
        torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.LayerNorm(4 * d),
        torch.nn.Linear(4 * d, 4 * d), torch.nn.GELU(),
        torch.nn.Linear(4 * d, d)).to("cuda")
    params = list(model.parameters())
    n = args.replays
    xs = [torch.randn(64, d, device="cuda") for _ in range(n)]
    ys = [torch.randn(64, d, device="cuda") for _ in range(n)]
    static_x, static_y = xs[0].clone(), ys[0].clone()
    r = {"mode": pre.mode(), "backend": torch.cuda.get_allocator_backend(),
         "checks": {}}
    checks = r["checks"]
    gm = GraphMem()

    # Warm up on a side stream, as torch.cuda.graph's documentation does.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            F.mse_loss(model(static_x), static_y).backward()
            model.zero_grad(set_to_none=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    before = pre.counters() if pre.loaded() else {}
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = F.mse_loss(model(static_x), static_y)
        static_loss.backward()
    torch.cuda.synchronize()
    after = pre.counters() if pre.loaded() else {}
    grads = [p.grad for p in params]
    if before:
        r["captured_mallocs"] = after["mallocs"] - before["mallocs"]
        r["captured_forwarded"] = after["forwarded"] - before["forwarded"]

    worst_loss = worst_grad = 0.0
    bitwise = 0
    for i in range(n):
        static_x.copy_(xs[i])
        static_y.copy_(ys[i])
        g.replay()
        loss = F.mse_loss(model(xs[i]), ys[i])
        ref = torch.autograd.grad(loss, params)
        torch.cuda.synchronize()
        worst_loss = max(worst_loss, abs(static_loss.item() - loss.item()))
        same = static_loss.item() == loss.item()
        for a, b in zip(grads, ref):
            diff = (a - b).abs().max().item()
            worst_grad = max(worst_grad, diff / max(b.abs().max().item(), 1e-12))
            same = same and diff == 0
        bitwise += same
    r["max_loss_diff"], r["max_grad_rel_diff"] = worst_loss, worst_grad
    r["bitwise_equal_replays"] = bitwise
    checks[f"{n} replays match eager mode (loss within 1e-5, gradients "
           f"within 1e-4 relative)"] = worst_loss <= 1e-5 and worst_grad <= 1e-4

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    r["replay_ms"] = 1e3 * (time.perf_counter() - t0) / n
    # After launches: the driver maps a graph's memory at its first launch.
    r["graph_used_high"] = gm.get(1)

    # The graph and everything it allocated go: graph memory comes back.
    del g, static_loss, grads, loss, ref
    model.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.synchronize()
    deadline = time.time() + 5
    used = gm.get(0)
    while used[0] != 0 and time.time() < deadline:
        time.sleep(0.01)
        used = gm.get(0)
    r["graph_used_after"] = used
    if pre.loaded() and pre.mode() == "cuda":
        # The driver's own figure cannot be had past the interposer (it
        # wraps the driver's name too): tidepool's answers are checked
        # through the counters instead, and the two names must agree.
        theirs = r["graph_used_high"]
        checks["the graph's memory is counted, the same through the runtime's "
               "and the driver's names"] = theirs[0] > 0 and theirs[0] == theirs[1]
        checks["every allocation during capture answered by tidepool, none "
               "forwarded"] = (r["captured_mallocs"] > 0
                               and r["captured_forwarded"] == 0)
    else:
        checks["the driver's graph memory held the graph's allocations"] = (
            r["graph_used_high"][1] > 0)
    print("RESULT " + json.dumps(r), flush=True)
    return 0


# ---------------------------------------------------------------------------
# Parent
# ---------------------------------------------------------------------------

def run(name, cmd, env, timeout):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    with open(os.path.join(OUT, f"preload_{name}.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
            res["wall_s"] = time.time() - t0
            res["stderr_tail"] = p.stderr.splitlines()[-3:]
            return res, None
    tail = "\n".join((p.stdout + p.stderr).splitlines()[-20:])
    return None, f"exit {p.returncode}, no result:\n{tail}"


def main():
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="the tidepool-run launcher")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--replays", type=int, default=100,
                    help="replays of the captured graph, each checked")
    ap.add_argument("--only", help="comma-separated runs of: driver, "
                    "tidepool, oom, cupy, graph_driver, graph")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return {"train": child_train, "oom": child_oom, "cupy": child_cupy,
                "graph": child_graph}[args.child](args)
    if not args.run:
        sys.exit("--run tidepool-run is required")
    OUT = args.out
    os.makedirs(OUT, exist_ok=True)

    base = dict(os.environ)
    for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD",
              "TIDEPOOL_PRELOAD"):
        base.pop(k, None)
    base["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    me = [sys.executable, os.path.abspath(__file__), "--steps", str(args.steps),
          "--replays", str(args.replays)]
    driver_env = dict(base, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    tp_env = dict(base, TIDEPOOL_PRELOAD_REPORT="1")
    tp = [os.path.abspath(args.run)]

    results, errors = {}, {}
    plan = [
        ("driver", me + ["--child", "train"], driver_env),
        ("tidepool", tp + me + ["--child", "train"], tp_env),
        ("oom", tp + me + ["--child", "oom"], tp_env),
        ("cupy", tp + me + ["--child", "cupy"], tp_env),
        ("graph_driver", me + ["--child", "graph"], driver_env),
        ("graph", tp + me + ["--child", "graph"], tp_env),
    ]
    if args.only:
        keep = set(args.only.split(","))
        plan = [p for p in plan if p[0] in keep]
    for name, cmd, env in plan:
        print(f"== {name}: {' '.join(os.path.basename(c) for c in cmd[:3])} ...",
              flush=True)
        res, err = run(name, cmd, env, args.timeout)
        if err:
            errors[name] = err
            print(f"   {name}: FAILED: {err}", flush=True)
        else:
            results[name] = res
            print(f"   {name}: done in {res['wall_s']:.0f} s", flush=True)

    failures = []
    rows = []
    d, t = results.get("driver"), results.get("tidepool")
    if d and t:
        same = d["losses"] == t["losses"]
        if not same:
            failures.append("losses differ between the driver and tidepool-run")
        warm = min(10, args.steps // 2)
        dm = 1e3 * statistics.median(d["times_s"][warm:])
        tm = 1e3 * statistics.median(t["times_s"][warm:])
        rows.append(("PyTorch backend:cudaMallocAsync", "driver pool",
                     f"{dm:.2f} ms", f"{d['peak_reserved'] / MiB:.0f} MiB",
                     f"{d['peak_allocated'] / MiB:.0f} MiB", "reference"))
        rows.append(("PyTorch under tidepool-run", t["mode"],
                     f"{tm:.2f} ms ({tm / dm:.3f}x)",
                     f"{t['peak_reserved'] / MiB:.0f} MiB "
                     f"({t['peak_reserved'] / max(d['peak_reserved'], 1):.3f}x)",
                     f"{t['peak_allocated'] / MiB:.0f} MiB",
                     "losses identical" if same else "LOSSES DIFFER"))
        if t["backend"] != "cudaMallocAsync":
            failures.append(f"tidepool run's backend is {t['backend']}")
        if t["mode"] != "cuda":
            failures.append(f"interposer mode is {t['mode']}, not cuda")
    o = results.get("oom")
    if o:
        ok = all(o["checks"].values()) and o["checks"]
        rows.append(("PyTorch out of memory", o["mode"],
                     f"filled {o.get('filled_gib', 0)} GiB in "
                     f"{o.get('fill_s', 0):.1f} s", "-", "-",
                     "OutOfMemoryError, then trains on" if ok else "FAILED"))
    c = results.get("cupy")
    if c:
        runtime = ("runtime linked statically" if c.get("static_runtime")
                   else "shared runtime")
        if c.get("skipped"):
            verdict = c["skipped"]
        elif c["routed"]:
            verdict = (f"{c['answered_mallocs']} allocations answered by "
                       f"tidepool ({runtime}; {c['driver_level_calls']} calls "
                       f"through the driver's entry points)")
        else:
            verdict = f"NOT ROUTED ({runtime}): a failure"
            failures.append("CuPy's allocations did not reach tidepool")
        rows.append((f"CuPy {c.get('cupy', '')} MemoryAsyncPool", c["mode"],
                     "-", f"{c.get('cupy_total_bytes', 0) / MiB:.0f} MiB", "-",
                     verdict))
    gd, gt = results.get("graph_driver"), results.get("graph")
    for name, gr in (("driver", gd), ("tidepool", gt)):
        if not gr:
            continue
        ratio = (f" ({gr['replay_ms'] / gd['replay_ms']:.3f}x)"
                 if gd and gr is gt else "")
        held = gr["graph_used_high"][0] - (gr["graph_used_high"][1]
                                           if gr is gt else 0)
        rows.append((f"torch.cuda.graph fwd+bwd, {name}", gr["mode"],
                     f"{gr['replay_ms']:.3f} ms/replay{ratio}",
                     f"graph {held / MiB:.0f} MiB", "-",
                     f"{gr['bitwise_equal_replays']}/{args.replays} replays "
                     f"bitwise = eager, max loss diff {gr['max_loss_diff']:.1e}"))
    if gd and gt:
        # What PyTorch leaves of a graph's memory once the graph is gone
        # (outputs it still holds), against the driver's in the same script:
        # tidepool must hold no more.
        left_tp, left_drv = gt["graph_used_after"][0], gd["graph_used_after"][0]
        print(f"   graph memory in use after the graph is gone: tidepool "
              f"{left_tp / MiB:.0f} MiB, driver {left_drv / MiB:.0f} MiB")
        if left_tp > left_drv:
            failures.append("tidepool holds more graph memory than the driver "
                            "once the graph is gone")
    if gt and gt["mode"] != "cuda":
        failures.append(f"graph run's interposer mode is {gt['mode']}")
    for name, r in results.items():
        for check, ok in r.get("checks", {}).items():
            print(f"   [{'ok' if ok else 'FAIL'}] {name}: {check}")
            if not ok:
                failures.append(f"{name}: {check}")
    for name, err in errors.items():
        failures.append(f"{name}: {err.splitlines()[0]}")

    print()
    head = ("run", "interposer", "median step", "peak reserved",
            "peak allocated", "result")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(6)]
    for r in [head] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    if t and "counters" in t:
        print(f"interposer counters (training run): {t['counters']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "errors": errors,
                       "failures": failures}, f)
    print()
    if failures:
        print(f"{len(failures)} check(s) FAILED:")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("all checks passed")
    return 0


OUT = "."
if __name__ == "__main__":
    sys.exit(main())
