#!/usr/bin/env python3
"""Writes the synthetic inputs of tidepool-replay's format tests into this
directory: PyTorch memory snapshots built the way PyTorch 2.11 lays them out
(the dict of torch.cuda.memory._snapshot(), pickled by _dump_snapshot with
the stdlib pickle module), RMM logging-adaptor CSVs, and damaged variants of
both. Deterministic: running it again rewrites the same bytes.

    python3 test/data/make_test_data.py

The figures the tests expect are stated next to each trace below and in
test/test_replay_formats.c.
"""

import gzip
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20

# The default stream is 0; another stream is the integer value of its
# cudaStream_t, a pointer.
SIDE = 0x55AA11223344


def frames(line):
    """A stack of two Python frames, as the snapshot records them."""
    return [
        {"filename": "train.py", "line": line, "name": "step"},
        {"filename": "torch/nn/modules/module.py", "line": 1773,
         "name": "_call_impl"},
    ]


def entry(action, addr, size, stream=0, t=[1_735_000_000_000_000], fr=None):
    # One shared frames list per call site, so that the pickle's memo is
    # exercised as in a real snapshot.
    t[0] += 17
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "time_us": t[0]}
    e["frames"] = fr if fr is not None else []
    return e


def small_snapshot():
    """One device. PyTorch's allocator reserves a 20 MiB and a 2 MiB segment
    (peak reserved 22 MiB = 23068672 bytes); the live bytes asked for peak
    at 4000000 (a1 + a2). 5 allocations, 2 streams, one free of an
    allocation made before the history began, an oom and a snapshot event
    (skipped)."""
    s1, s2 = 0x7F0000000000, 0x7F0002000000
    fa, fb = frames(10), frames(20)
    tr = [
        entry("free_requested", 0x7EFFF0000000, 4096, fr=fa),  # before history
        entry("segment_alloc", s1, 20 * MiB, fr=fa),
        entry("alloc", s1, 1_000_000, fr=fa),                  # a1
        entry("alloc", s1 + MiB, 3_000_000, fr=fa),            # a2
        entry("free_requested", s1, 1_000_000, fr=fb),
        entry("free_completed", s1, 1_000_000, fr=fb),
        entry("alloc", s1, 500_000, SIDE, fr=fb),              # a3
        entry("segment_alloc", s2, 2 * MiB, fr=fb),
        entry("alloc", s2, 512, fr=fb),                        # a4
        {"action": "oom", "device_free": 1 << 30, "size": 1 << 40,
         "stream": 0, "time_us": 1_735_000_000_001_000, "frames": fa},
        entry("free_requested", s1 + MiB, 3_000_000, fr=fa),
        entry("free_completed", s1 + MiB, 3_000_000, fr=fa),
        entry("free_requested", s1, 500_000, SIDE, fr=fb),
        entry("snapshot", 0, 0, fr=[]),
        entry("free_requested", s2, 512, fr=fb),
        entry("free_completed", s2, 512, fr=fb),
        entry("segment_free", s2, 2 * MiB, fr=fb),
        entry("alloc", s1 + 2 * MiB, 2_000_000, fr=fa),        # a5
    ]
    # Newer PyTorch versions add keys to some entries; readers skip them.
    tr[3]["compile_context"] = "N/A"
    tr[3]["user_metadata"] = ""
    segments = [{
        "device": 0, "address": s1, "total_size": 20 * MiB,
        "allocated_size": 2_097_152, "active_size": 2_097_152,
        "requested_size": 2_000_000, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": fa,
        "blocks": [
            {"address": s1, "size": 2 * MiB, "requested_size": 0,
             "state": "inactive", "frames": []},
            {"address": s1 + 2 * MiB, "size": 2_097_152,
             "requested_size": 2_000_000, "state": "active_allocated",
             "frames": fa},
        ],
    }]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
                "expandable_segments": False,
                "pinned_num_register_threads": 1,
                "release_lock_on_cudamalloc": False,
                "pinned_use_cuda_host_register": False,
                "roundup_power2_divisions": {"1": 0, "2": 0}}
    # Device 1 has no events; the reader takes device 0.
    return {"segments": segments, "device_traces": [tr, []],
            "allocator_settings": settings}


def expandable_snapshot():
    """expandable_segments:True: PyTorch maps and unmaps ranges of one
    segment. Mapped: 4 MiB, then 6 MiB more (10 MiB, the peak = 10485760),
    then 6 MiB unmapped, 2 MiB mapped. Live bytes peak at 7000000."""
    base = 0x7F1000000000
    fr = frames(30)
    tr = [
        entry("segment_map", base, 4 * MiB, fr=fr),
        entry("alloc", base, 3_000_000, fr=fr),
        entry("segment_map", base + 4 * MiB, 6 * MiB, fr=fr),
        entry("alloc", base + 4 * MiB, 4_000_000, fr=fr),
        entry("free_requested", base + 4 * MiB, 4_000_000, fr=fr),
        entry("free_completed", base + 4 * MiB, 4_000_000, fr=fr),
        entry("segment_unmap", base + 4 * MiB, 6 * MiB, fr=fr),
        entry("segment_map", base + 4 * MiB, 2 * MiB, fr=fr),
        entry("alloc", base + 4 * MiB, 1_500_000, fr=fr),
        entry("free_requested", base, 3_000_000, fr=fr),
    ]
    return {"segments": [], "device_traces": [tr],
            "allocator_settings": {"expandable_segments": True}}


def rmm_log():
    """RMM's logging adaptor: peak live 3145728 (1 MiB + 2 MiB), two
    streams (0 and 0x7f00aa000010), a failed allocation (skipped), a free
    of an unknown pointer (skipped)."""
    rows = [
        "Thread,Time,Action,Pointer,Size,Stream",
        "2342727,15:47:02.841961,allocate,0x7f0012400000,1048576,0",
        "2342727,15:47:02.841970,allocate,0x7f0012500000,2097152,0x7f00aa000010",
        "2342727,15:47:02.841977,allocate failure,(nil),68719476736,0",
        "2342727,15:47:02.841980,free,0x7f0012400000,1048576,0",
        "2342728,15:47:02.842001,allocate,0x7f0012400000,524288,0",
        "2342728,15:47:02.842010,free,0x7f0099990000,4096,0",
        "2342727,15:47:02.842100,free,0x7f0012500000,2097152,0x7f00aa000010",
        "2342727,15:47:02.842200,free,0x7f0012400000,524288,0",
    ]
    return "\n".join(rows) + "\n"


def write(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)


def main():
    small = small_snapshot()
    # _dump_snapshot uses pickle.dump with the default protocol (4 on the
    # Pythons PyTorch 2.11 supports, 5 from Python 3.14): write both, and 2
    # (gzip'd) for the older opcodes (BINPUT instead of MEMOIZE, no FRAME).
    write("snapshot_small.pickle", pickle.dumps(small, protocol=4))
    write("snapshot_p5.pickle", pickle.dumps(small, protocol=5))
    write("snapshot_p2.pickle.gz",
          gzip.compress(pickle.dumps(small, protocol=2), mtime=0))
    write("snapshot_expandable.pickle",
          pickle.dumps(expandable_snapshot(), protocol=4))
    write("rmm_small.csv", rmm_log().encode())

    # Damaged variants, each refused with the file and the place named.
    whole = pickle.dumps(small, protocol=4)
    write("bad_snapshot_truncated.pickle", whole[: len(whole) // 2])
    bad = small_snapshot()
    bad["device_traces"][0][3]["size"] = "3000000"
    write("bad_snapshot_size_type.pickle", pickle.dumps(bad, protocol=4))
    bad = small_snapshot()
    del bad["device_traces"][0][6]["stream"]
    write("bad_snapshot_no_stream.pickle", pickle.dumps(bad, protocol=4))
    bad = small_snapshot()
    bad["device_traces"][0][2] = ["alloc", 1, 2, 0]
    write("bad_snapshot_entry_list.pickle", pickle.dumps(bad, protocol=4))
    write("bad_snapshot_no_traces.pickle",
          pickle.dumps({"segments": []}, protocol=4))
    write("bad_snapshot_empty_traces.pickle",
          pickle.dumps({"segments": [], "device_traces": [[], []]},
                       protocol=4))
    write("bad_snapshot_list.pickle", pickle.dumps([1, 2, 3], protocol=4))
    # A set is not plain data the reader knows (EMPTY_SET, ADDITEMS).
    bad = small_snapshot()
    bad["allocator_settings"]["odd"] = {1, 2}
    write("bad_snapshot_set.pickle", pickle.dumps(bad, protocol=4))
    # One byte in the middle of the entries becomes an opcode no pickle has.
    flipped = bytearray(whole)
    at = whole.index(b"free_completed")
    flipped[at - 2] = 0xFF
    write("bad_snapshot_flipped.pickle", bytes(flipped))
    # Segments that add up past 2^64 bytes (the sum once wrapped).
    events = [{"action": "segment_alloc", "addr": i, "size": 1 << 62,
               "stream": 0} for i in range(5)]
    events.append({"action": "alloc", "addr": 1, "size": 100, "stream": 0})
    write("bad_snapshot_segments_wrap.pickle",
          pickle.dumps({"device_traces": [events]}, protocol=4))
    rows = rmm_log().splitlines()
    rows[4] = "2342727,15:47:02.841980,free,0xZZ,1048576,0"
    write("bad_rmm_pointer.csv", ("\n".join(rows) + "\n").encode())
    rows = rmm_log().splitlines()
    rows[2] = "2342727,15:47:02.841970,allocate,0x7f0012500000,2097152"
    write("bad_rmm_fields.csv", ("\n".join(rows) + "\n").encode())


if __name__ == "__main__":
    main()
