#!/usr/bin/env python3
"""make_corpus: writes the seed inputs of fuzz_api (test/fuzz/corpus/).

An input is a program of calls, one opcode byte each followed by its
arguments (fuzz_api.c reads them). This script encodes programs written as
Python calls, keeping the same lists of live streams, pools, blocks and gates
as the fuzzer so that the indices it writes name what was meant, and the
opcode numbers come from the ops[] table of fuzz_api.c, so that the two stay
in step. Scenario seeds reach the model's harder states in a few calls
(gated reuse with and without internal dependencies, events, the legacy
stream, IPC holds, out-of-memory, issue 14's findings). The rest of the
corpus was grown from these by fuzzing and minimised with libFuzzer's
-merge=1 (run.sh leaves a run's corpus in its --out directory).
Deterministic: the same script writes the same files.

Usage: make_corpus.py [OUTPUT_DIR]  (default: the corpus/ beside this file)
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def opcodes():
    src = open(os.path.join(HERE, "fuzz_api.c")).read()
    table = re.search(r"static const op_fn ops\[\] = \{(.*?)\};", src, re.S)
    names = re.findall(r"op_\w+", table.group(1))
    codes = {}
    for i, n in enumerate(names):
        codes.setdefault(n[3:], i)
    return codes


OPS = opcodes()
KiB = 1 << 10
MiB = 1 << 20


def size_bytes(size):
    """The three bytes rd_size turns into `size`."""
    if size == 0:
        return [0, 0, 0]
    if size <= 32 * KiB:
        v = size - 1
        return [4, v & 255, v >> 8]
    if (size - 32 * KiB) % 16 == 0 and (size - 32 * KiB) // 16 < 65536:
        v = (size - 32 * KiB) // 16
        return [7, v & 255, v >> 8]
    if size % (64 * KiB) == 0 and size // (64 * KiB) <= 64:
        v = size // (64 * KiB) - 1
        return [9, v & 255, v >> 8]
    if size % MiB == 0 and size // MiB <= 20:
        v = size // MiB - 1
        return [14, v & 255, v >> 8]
    raise ValueError("no encoding for size %d" % size)


class Prog:
    """A program for fuzz_api, with the fuzzer's view of its objects."""

    def __init__(self):
        self.b = []
        # Model streams: (device, live); 0 and 1 are the legacy streams.
        self.streams = [[0, True], [1, True]]
        # Model pools: [live, imported]; 0 and 1 are the default pools.
        self.pools = [[True, False], [True, False]]
        self.blocks = {}  # slot -> True (live), False, or "held"
        self.gates = []  # open flags
        self.events = []  # live flags

    def op(self, name, *args):
        self.b.append(OPS[name])
        for a in args:
            if isinstance(a, list):
                self.b.extend(a)
            else:
                self.b.append(a & 255)

    # -- index helpers, as pick_* in fuzz_api.c ------------------------------
    def _stream(self, s):
        live = [i for i, (_, l) in enumerate(self.streams) if l]
        return live.index(s)

    def _pool(self, p, live_only, imported):
        v = [i for i, (l, imp) in enumerate(self.pools)
             if (l or not live_only) and (imported or not imp)]
        return v.index(p)

    def _block(self, k):
        live = sorted(s for s, l in self.blocks.items() if l is True)
        return live.index(k)

    def _new_block(self):
        k = 0
        while self.blocks.get(k) in (True, "held"):
            k += 1
        self.blocks[k] = True
        return k

    # -- operations -------------------------------------------------------
    def stream_create(self, device=0, nonblocking=True):
        self.op("stream_create", (device << 1) | (1 if nonblocking else 0))
        self.streams.append([device, True])
        return len(self.streams) - 1

    def stream_destroy(self, s):
        self.op("stream_destroy", self._stream(s))
        self.streams[s][1] = False

    def pool_create(self, kind=0, max_code=0, exportable=False):
        """kind: 0 device 0, 3 device 1, 4 host, 5 NUMA, 6 managed."""
        a = kind | (0 if exportable else 8)
        self.op("pool_create", a, max_code << 1)
        self.pools.append([True, False])
        return len(self.pools) - 1

    def pool_destroy(self, p):
        self.op("pool_destroy", self._pool(p, False, True))
        self.pools[p][0] = False

    def set_current(self, p, device=0):
        self.op("set_current", self._pool(p, False, True), device)

    def malloc(self, s, size):
        self.op("malloc_current", self._stream(s), size_bytes(size))
        return self._new_block()

    def malloc_pool(self, s, size, p):
        self.op("malloc_pool", self._stream(s), size_bytes(size),
                self._pool(p, True, True))
        return self._new_block()

    def free(self, k, s=None):
        """Frees on the block's owner, or on stream s (after a hand-off)."""
        if s is None:
            self.op("free", self._block(k), 0)
        else:
            self.op("free", self._block(k), 1, self._stream(s))
        self.blocks[k] = False

    def write(self, k, s=None, check=False):
        how = (1 if s is not None else 0) | (2 if check else 0)
        args = [self._block(k), how]
        if s is not None:
            args.append(self._stream(s))
        self.op("write", *args)

    def check(self, k):
        self.op("check", self._block(k))

    def gate(self, s):
        self.op("gate", self._stream(s))
        self.gates.append(False)
        return len(self.gates) - 1

    def open(self, g):
        closed = [i for i, o in enumerate(self.gates) if not o]
        self.op("open", closed.index(g))
        self.gates[g] = True

    def sync(self, s):
        self.op("stream_sync", self._stream(s), 0)

    def query(self, s):
        self.op("stream_sync", self._stream(s), 1)

    def device_sync(self, d=0):
        self.op("device_sync", d)

    def event_create(self, device=0):
        self.op("event", 0, device)
        self.events.append(True)
        return len(self.events) - 1

    def _event(self, e):
        live = [i for i, l in enumerate(self.events) if l]
        return live.index(e)

    def record(self, e, s):
        self.op("event", 1, self._event(e), self._stream(s))

    def wait(self, s, e):
        self.op("event", 2, self._event(e), self._stream(s))

    def event_query(self, e):
        self.op("event", 3, self._event(e))

    def event_sync(self, e):
        self.op("event", 4, self._event(e))

    def attr(self, p, which, value):
        """which: 0 follow events, 1 opportunistic, 2 internal deps,
        3 OOM wait (value 0/1); 4 threshold (value: index of th[]);
        6 reset used high; 7 reset reserved high."""
        self.op("attr", self._pool(p, True, False), which, value)

    def trim(self, p, keep_code=0):
        self.op("trim", self._pool(p, True, True), keep_code)

    def access(self, p, device, flags_code):
        """flags_code: 0 none, 1 read, 2 read-write."""
        self.op("access", self._pool(p, True, False),
                device | (flags_code << 1))

    def fault(self, k, s):
        self.op("fault", self._block(k), self._stream(s))

    def bad(self, what, k=0, s=0, extra=()):
        self.op("bad", what, k, self._stream(s), *extra)

    def export_pointer(self, k):
        self.op("export_pointer", self._block(k))

    def import_pool(self, p):
        self.op("import_pool", self._pool(p, False, False))
        self.pools.append([True, True])
        return len(self.pools) - 1

    def import_pointer(self, k, how=0):
        # One imported pool: the loop in op_import_pointer reads no byte.
        self.op("import_pointer", self._block(k), how)

    def free_import(self, idx, s):
        self.op("free_import", idx, self._stream(s))

    def quiesce(self):
        self.op("quiesce_r")

    def set_device(self, d):
        self.op("set_device", d)

    def bytes(self):
        return bytes(self.b)


def scenarios():
    out = {}

    # Issue 14, finding 2: USED_MEM_HIGH below USED_MEM_CURRENT.
    p = Prog()
    x, y = p.stream_create(), p.stream_create()
    pool = p.pool_create()
    a = p.malloc_pool(x, 100000, pool)
    p.free(a)
    p.malloc_pool(y, 50000, pool)
    p.malloc_pool(x, 90000, pool)
    out["issue14-finding2-used-high"] = p

    # Gated reuse: a free behind a closed gate, then allocations on another
    # stream, with internal dependencies on (the stream must wait) and off.
    for internal in (1, 0):
        p = Prog()
        x, y = p.stream_create(), p.stream_create()
        pool = p.pool_create()
        p.attr(pool, 2, internal)
        a = p.malloc_pool(x, 3 * MiB, pool)
        g = p.gate(x)
        p.write(a)
        p.free(a)
        b = p.malloc_pool(y, 3 * MiB, pool)
        p.query(y)
        p.open(g)
        p.check(b)
        p.quiesce()
        out["gated-reuse-internal%d" % internal] = p

    # Events: a free ordered before an event that another stream waits on.
    for follow in (1, 0):
        p = Prog()
        x, y = p.stream_create(), p.stream_create()
        pool = p.pool_create()
        p.attr(pool, 0, follow)
        p.attr(pool, 2, 0)
        e = p.event_create()
        a = p.malloc_pool(x, 1 * MiB, pool)
        g = p.gate(x)
        p.write(a)
        p.free(a)
        p.record(e, x)
        p.wait(y, e)
        p.malloc_pool(y, 1 * MiB, pool)
        p.event_query(e)
        p.open(g)
        p.event_sync(e)
        p.quiesce()
        out["event-follow%d" % follow] = p

    # Policies off: a completed free that nothing reported is not taken by
    # another stream without ALLOW_OPPORTUNISTIC; after a synchronize it is.
    for sizes in ((3 * MiB, 3 * MiB), (8192, 8192)):
        p = Prog()
        x, y = p.stream_create(), p.stream_create()
        pool = p.pool_create()
        for which in (1, 2, 3):
            p.attr(pool, which, 0)
        a = p.malloc_pool(x, sizes[0], pool)
        p.free(a)
        p.malloc_pool(y, sizes[1], pool)
        p.sync(x)
        p.malloc_pool(y, sizes[1], pool)
        p.quiesce()
        out["policies-off-%d" % sizes[0]] = p

    # The legacy stream orders blocking streams.
    p = Prog()
    x = p.stream_create(nonblocking=False)
    g = p.gate(0)
    a = p.malloc(x, 8192)
    p.write(a)
    p.free(a)
    p.malloc(0, 8192)
    p.query(x)
    p.open(g)
    p.sync(0)
    p.quiesce()
    out["legacy-ordering"] = p

    # Small blocks through slabs and stream caches, across streams.
    p = Prog()
    ss = [p.stream_create(nonblocking=i % 2 == 0) for i in range(3)]
    blocks = []
    for i in range(24):
        blocks.append(p.malloc(ss[i % 3], 64 + 700 * i))
    for i, k in enumerate(blocks):
        p.free(k, ss[(i + 1) % 3] if i % 4 == 0 else None)
    for i in range(12):
        p.malloc(ss[i % 3], 100 + 1000 * i)
    p.quiesce()
    out["small-blocks"] = p

    # Out of memory: a pool with a limit, then the device.
    p = Prog()
    s = p.stream_create()
    pool = p.pool_create(max_code=2)  # 4 MiB
    p.attr(pool, 3, 0)
    a = p.malloc_pool(s, 3 * MiB, pool)
    p.malloc_pool(s, 2 * MiB, pool)
    p.free(a)
    p.sync(s)
    p.malloc_pool(s, 4 * MiB, pool)
    p.malloc(s, 20 * MiB)
    p.malloc(s, 20 * MiB)
    p.quiesce()
    out["out-of-memory"] = p

    # Release threshold and trim.
    p = Prog()
    s = p.stream_create()
    pool = p.pool_create()
    p.attr(pool, 4, 3)  # 3 MiB
    ks = [p.malloc_pool(s, 2 * MiB, pool) for _ in range(3)]
    for k in ks:
        p.free(k)
    p.sync(s)
    p.trim(pool, 2)
    p.trim(pool, 0)
    p.attr(pool, 6, 0)
    p.attr(pool, 7, 0)
    p.quiesce()
    out["threshold-trim"] = p

    # Peer access: a device-1 stream writes device-0 memory once granted.
    p = Prog()
    s1 = p.stream_create(device=1)
    pool = p.pool_create()
    a = p.malloc_pool(s1, 64 * KiB, pool)
    p.fault(a, s1)
    p.sync(s1)
    p.access(pool, 1, 2)
    p.write(a, s1, check=True)
    p.access(pool, 1, 1)
    p.quiesce()
    out["peer-access"] = p

    # Destroys in every order: a pool with live blocks, a stream with work.
    p = Prog()
    x = p.stream_create()
    pool = p.pool_create()
    p.set_current(pool)
    a = p.malloc(x, 1 * MiB)
    g = p.gate(x)
    p.write(a)
    p.pool_destroy(pool)
    p.stream_destroy(x)
    p.free(a)
    p.open(g)
    p.quiesce()
    out["destroy-orders"] = p

    # IPC within the process: export, import, hold past the exporter's free.
    p = Prog()
    s = p.stream_create()
    pool = p.pool_create(exportable=True)
    a = p.malloc_pool(s, 3 * MiB, pool)
    p.export_pointer(a)
    p.import_pool(pool)
    p.import_pointer(a)
    p.free(a)
    p.blocks[a] = "held"  # an importer holds it: its slot stays taken
    p.malloc_pool(s, 3 * MiB, pool)
    g = p.gate(s)
    p.free_import(0, s)
    p.blocks[a] = False
    p.malloc_pool(s, 3 * MiB, pool)
    p.open(g)
    p.quiesce()
    out["ipc-hold"] = p

    # Bad input of every kind.
    p = Prog()
    s = p.stream_create()
    a = p.malloc(s, 4096)
    for what in range(24):
        p.bad(what, what * 7, 0, extra=(0, 0))
    p.free(a)
    p.bad(3, 2)
    out["bad-input"] = p

    # Findings of this fuzzer, fixed since: each input failed before its fix.
    # A blocking stream that waited for an event recorded on the legacy
    # stream takes a later free of another blocking stream for ordered.
    p = Prog()
    x = p.stream_create(nonblocking=False)
    y = p.stream_create(nonblocking=False)
    pool = p.pool_create()
    e = p.event_create()
    p.record(e, 0)
    p.wait(y, e)
    a = p.malloc_pool(x, 31 * 64 * KiB, pool)
    p.gate(x)
    p.write(a)
    p.free(a)
    k = p.malloc_pool(y, 17 * KiB, pool)
    p.quiesce()
    out["regress-legacy-event-clock"] = p

    # A wait of the legacy stream for a completed event counts as a legacy
    # operation though nothing was queued.
    p = Prog()
    x = p.stream_create(nonblocking=False)
    y = p.stream_create(nonblocking=False)
    pool = p.pool_create()
    e = p.event_create()
    a = p.malloc_pool(x, 31 * 64 * KiB, pool)
    p.gate(x)
    p.write(a)
    p.free(a)
    p.wait(0, e)
    p.malloc_pool(y, 17 * KiB, pool)
    p.quiesce()
    out["regress-legacy-wait-counts"] = p
    return out


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    os.makedirs(outdir, exist_ok=True)
    progs = scenarios()
    for name, prog in sorted(progs.items()):
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(prog.bytes())
    print("%d inputs written to %s" % (len(progs), outdir))


if __name__ == "__main__":
    main()
