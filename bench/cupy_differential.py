#!/usr/bin/env python3
"""CuPy's runtime calls, answered by the driver and by tidepool, compared.

One script of CuPy calls (cupy.cuda.runtime: stream-ordered allocation and
free on several streams, bad input, out of memory, pool attributes, pools
made current and destroyed, reuse across streams through events, captures
in the three modes, the legacy stream during a capture, graphs relaunched
while an output is live, threads on MemoryAsyncPool) runs twice, each time
in a process of its own: natively, then under tidepool-run. Every step's
outcome (its value, or the error it raised) goes into one JSON line; the
parent prints the steps whose outcomes differ and exits 1 if any does.
Addresses are not compared: a step that makes one records whether it got
one.

    python3 bench/cupy_differential.py --run build/tidepool-run [--all]

Needs a GPU and CuPy; exits 0 with a note when CuPy is missing.
"""

import argparse
import json
import os
import subprocess
import sys
import threading


def child():
    import cupy
    import numpy as np
    rt = cupy.cuda.runtime
    out = {}

    def step(name, fn):
        try:
            v = fn()
            if not isinstance(v, (int, float, str, bool, list, type(None))):
                v = type(v).__name__
            out[name] = ["ok", v]
            return v
        except Exception as e:  # the outcome is what is compared
            out[name] = ["error", type(e).__name__, str(e)[:120]]
            return None

    def made(name, fn):
        """A step that makes a handle or an address: records whether it
        got one, and returns it."""
        v = step(name, fn)
        if out[name][0] == "ok":
            out[name][1] = bool(v)
        return v

    dev = 0
    s1 = rt.streamCreateWithFlags(1)
    s2 = rt.streamCreateWithFlags(1)
    dp = rt.deviceGetDefaultMemPool(dev)
    step("the default pool is current", lambda: rt.deviceGetMemPool(dev) == dp)
    for a in range(1, 5):
        step(f"default pool attribute {a}",
             lambda a=a: rt.memPoolGetAttribute(dp, a))

    # -- allocation and free ----------------------------------------------
    def data():
        n = 1 << 20
        h = np.arange(n, dtype=np.float32)
        p = rt.mallocAsync(n * 4, s1)
        rt.memcpyAsync(p, h.ctypes.data, n * 4, rt.memcpyHostToDevice, s1)
        q = rt.mallocAsync(n * 4, s1)
        rt.memcpyAsync(q, p, n * 4, rt.memcpyDeviceToDevice, s1)
        rt.freeAsync(p, s1)
        r = rt.mallocAsync(n * 4, s1)  # may take p's block in stream order
        rt.memsetAsync(r, 0, n * 4, s1)
        back = np.empty_like(h)
        rt.memcpyAsync(back.ctypes.data, q, n * 4, rt.memcpyDeviceToHost, s1)
        rt.streamSynchronize(s1)
        rt.freeAsync(q, s1)
        rt.freeAsync(r, s1)
        rt.streamSynchronize(s1)
        return bool((back == h).all())

    step("data survives reuse in stream order", data)
    step("used after the frees", lambda: rt.memPoolGetAttribute(dp, 7))
    step("free of NULL", lambda: rt.freeAsync(0, s1))
    made("allocation of 0 bytes", lambda: rt.mallocAsync(0, s1))
    step("free of an unknown pointer", lambda: rt.freeAsync(0x1234000, s1))

    def double_free():
        p = rt.mallocAsync(4096, s1)
        rt.freeAsync(p, s1)
        rt.freeAsync(p, s1)

    step("double free", double_free)
    step("synchronize after errors", lambda: rt.streamSynchronize(s1))
    made("allocation of 1 PiB", lambda: rt.mallocAsync(1 << 50, s1))
    step("synchronize after out of memory", lambda: rt.streamSynchronize(s1))

    # -- attributes -------------------------------------------------------
    step("unknown attribute read", lambda: rt.memPoolGetAttribute(dp, 99))
    step("unknown attribute set", lambda: rt.memPoolSetAttribute(dp, 99, 0))
    step("used current set", lambda: rt.memPoolSetAttribute(dp, 7, 0))
    step("used high set to 5", lambda: rt.memPoolSetAttribute(dp, 8, 5))
    step("used high reset", lambda: rt.memPoolSetAttribute(dp, 8, 0))
    step("reserved high reset", lambda: rt.memPoolSetAttribute(dp, 6, 0))
    step("release threshold set", lambda: rt.memPoolSetAttribute(dp, 4, 1 << 30))
    step("release threshold read", lambda: rt.memPoolGetAttribute(dp, 4))
    step("reuse policy off", lambda: rt.memPoolSetAttribute(dp, 1, 0))
    step("reuse policies read",
         lambda: [rt.memPoolGetAttribute(dp, a) for a in (1, 2, 3)])
    step("reuse policy on", lambda: rt.memPoolSetAttribute(dp, 1, 1))
    step("release threshold back to 0", lambda: rt.memPoolSetAttribute(dp, 4, 0))

    # -- pools --------------------------------------------------------------
    def make_pool():
        return rt.memPoolCreate(rt.MemPoolProps(1, 0, 1, dev))

    pool = made("pool made", make_pool)
    if pool:
        def from_pool():
            p = rt.mallocFromPoolAsync(3 << 20, pool, s2)
            used = rt.memPoolGetAttribute(pool, 7)
            reserved = rt.memPoolGetAttribute(pool, 5)
            rt.memsetAsync(p, 7, 3 << 20, s2)
            rt.freeAsync(p, s2)
            rt.streamSynchronize(s2)
            return [used, reserved >= used, rt.memPoolGetAttribute(pool, 7)]

        step("allocation from the pool", from_pool)
        step("trimmed to 0",
             lambda: (rt.memPoolTrimTo(pool, 0),
                      rt.memPoolGetAttribute(pool, 5))[1])
        step("the pool made current", lambda: rt.deviceSetMemPool(dev, pool))

        def current():
            p = rt.mallocAsync(1 << 20, s1)
            used = rt.memPoolGetAttribute(pool, 7)
            rt.freeAsync(p, s1)
            rt.streamSynchronize(s1)
            return used

        step("an allocation takes the current pool", current)
        step("the current pool destroyed", lambda: rt.memPoolDestroy(pool))
        step("the default is current again",
             lambda: rt.deviceGetMemPool(dev) == dp)

        def after_destroy():
            p = rt.mallocAsync(4096, s1)
            rt.freeAsync(p, s1)
            rt.streamSynchronize(s1)
            return p != 0

        step("allocation after the destroy", after_destroy)
        step("pool destroyed twice", lambda: rt.memPoolDestroy(pool))
        made("allocation from a destroyed pool",
             lambda: rt.mallocFromPoolAsync(4096, pool, s1))
    step("the default pool destroyed", lambda: rt.memPoolDestroy(dp))

    def cross_stream():
        n = 8 << 20
        p = rt.mallocAsync(n, s1)
        rt.memsetAsync(p, 1, n, s1)
        rt.freeAsync(p, s1)
        ev = rt.eventCreate()
        rt.eventRecord(ev, s1)
        rt.streamWaitEvent(s2, ev)
        q = rt.mallocAsync(n, s2)
        rt.memsetAsync(q, 2, n, s2)
        h = np.empty(n, np.uint8)
        rt.memcpyAsync(h.ctypes.data, q, n, rt.memcpyDeviceToHost, s2)
        rt.streamSynchronize(s2)
        rt.freeAsync(q, s2)
        rt.streamSynchronize(s2)
        rt.eventDestroy(ev)
        return bool((h == 2).all())

    step("reuse across streams through an event", cross_stream)

    # -- captures -------------------------------------------------------------
    def capture(mode):
        st = rt.streamCreateWithFlags(1)
        n = 1 << 16
        dst = rt.malloc(n)
        rt.streamBeginCapture(st, mode)
        p = rt.mallocAsync(n, st)
        rt.memsetAsync(p, 5, n, st)
        rt.memcpyAsync(dst, p, n, rt.memcpyDeviceToDevice, st)
        rt.freeAsync(p, st)
        g = rt.streamEndCapture(st)
        x = rt.graphInstantiate(g)
        for _ in range(3):
            rt.graphLaunch(x, st)
        rt.streamSynchronize(st)
        h = np.empty(n, np.uint8)
        rt.memcpy(h.ctypes.data, dst, n, rt.memcpyDeviceToHost)
        rt.graphExecDestroy(x)
        rt.graphDestroy(g)
        rt.free(dst)
        rt.streamDestroy(st)
        return bool((h == 5).all())

    for mode in (0, 1, 2):
        step(f"graph of capture mode {mode} launched 3 times",
             lambda m=mode: capture(m))

    # An output that outlives the graph's launches, step by step: the
    # driver refuses a launch while it is live, and takes one free after
    # each launch.
    st = rt.streamCreateWithFlags(1)
    step("outliving: begin", lambda: rt.streamBeginCapture(st, 2))
    p = made("outliving: allocation", lambda: rt.mallocAsync(1 << 20, st))
    g = made("outliving: end", lambda: rt.streamEndCapture(st))
    x = made("outliving: instantiate", lambda: rt.graphInstantiate(g))
    script = [("launch", lambda: rt.graphLaunch(x, st)),
              ("relaunch while live", lambda: rt.graphLaunch(x, st)),
              ("free", lambda: rt.freeAsync(p, st)),
              ("launch after the free", lambda: rt.graphLaunch(x, st)),
              ("free after the second launch", lambda: rt.freeAsync(p, st)),
              ("free once more", lambda: rt.freeAsync(p, st)),
              ("last launch", lambda: rt.graphLaunch(x, st)),
              ("exec destroyed", lambda: rt.graphExecDestroy(x)),
              ("graph destroyed", lambda: rt.graphDestroy(g))]
    for name, fn in script:
        step("outliving: " + name, fn)
        step("outliving: synchronize after " + name,
             lambda: rt.streamSynchronize(st))

    def kept():
        h = np.empty(1 << 20, np.uint8)
        rt.memsetAsync(p, 9, 1 << 20, st)
        rt.memcpyAsync(h.ctypes.data, p, 1 << 20, rt.memcpyDeviceToHost, st)
        rt.streamSynchronize(st)
        return bool((h == 9).all())

    step("outliving: the output is usable after its graph is gone", kept)
    step("outliving: its free", lambda: rt.freeAsync(p, st))
    step("outliving: synchronize", lambda: rt.streamSynchronize(st))

    # The legacy stream while a blocking stream captures: an allocation or
    # a free there is refused, and invalidates the capture, in every mode.
    sb = rt.streamCreate()
    for mode in (0, 1, 2):
        tag = f"legacy, mode {mode}: "
        step(tag + "begin", lambda m=mode: rt.streamBeginCapture(sb, m))
        made(tag + "allocation on the legacy stream",
             lambda: rt.mallocAsync(4096, 0))
        step(tag + "capture status", lambda: rt.streamIsCapturing(sb))
        made(tag + "end", lambda: rt.streamEndCapture(sb))
    q = rt.mallocAsync(4096, 0)
    rt.streamSynchronize(0)
    step("legacy free: begin", lambda: rt.streamBeginCapture(sb, 0))
    step("legacy free: the free", lambda: rt.freeAsync(q, 0))
    made("legacy free: end", lambda: rt.streamEndCapture(sb))
    step("legacy free: the block is still allocated", lambda: rt.freeAsync(q, 0))
    step("legacy free: synchronize", lambda: rt.streamSynchronize(0))

    # -- threads ----------------------------------------------------------
    def threads():
        pool = cupy.cuda.MemoryAsyncPool()
        cupy.cuda.set_allocator(pool.malloc)
        wrong = []

        def work(i):
            try:
                with cupy.cuda.Stream(non_blocking=True) as s:
                    for k in range(50):
                        a = cupy.arange((i + 1) * 1000 + k, dtype=cupy.float64)
                        if float((a * 2).sum()) != float(a.size * (a.size - 1)):
                            wrong.append((i, k))
                    s.synchronize()
            except Exception as e:  # reported, and compared
                wrong.append(repr(e))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        cupy.cuda.Device().synchronize()
        used = pool.used_bytes()
        pool.free_all_blocks()
        cupy.cuda.set_allocator(None)
        return [wrong[:3], used]

    step("8 threads on MemoryAsyncPool", threads)

    def attributes():
        p = rt.mallocAsync(4096, s1)
        a = rt.pointerGetAttributes(p)
        rt.freeAsync(p, s1)
        rt.streamSynchronize(s1)
        return [a.type, a.device]

    step("pointer attributes", attributes)
    step("memGetInfo: free <= total",
         lambda: (lambda f, t: f <= t)(*rt.memGetInfo()))

    def destroy_pending():
        s = rt.streamCreateWithFlags(1)
        rt.freeAsync(rt.mallocAsync(1 << 20, s), s)
        rt.streamDestroy(s)

    step("stream destroyed with a free pending", destroy_pending)
    cupy.cuda.Device().synchronize()
    step("used at the end", lambda: rt.memPoolGetAttribute(dp, 7))
    print("RESULT " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="tidepool-run")
    ap.add_argument("--all", action="store_true",
                    help="print the steps that agree too")
    args = ap.parse_args()
    res = {}
    for name, pre in (("driver", []), ("tidepool", [args.run])):
        p = subprocess.run(pre + [sys.executable, __file__, "--child"],
                           capture_output=True, text=True, timeout=600)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode == 3:
            print("CuPy is not importable: nothing compared")
            return 0
        if not line:
            print(f"{name}: exit {p.returncode}, no result\n{p.stderr[-2000:]}")
            return 1
        res[name] = json.loads(line[0][len("RESULT "):])
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
        try:
            import cupy  # noqa: F401
        except ImportError:
            sys.exit(3)
        child()
        sys.exit(0)
    sys.exit(main())
