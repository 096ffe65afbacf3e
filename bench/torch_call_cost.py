#!/usr/bin/env python3
"""Host time of one tensor allocation and free through PyTorch, on the
default stream and on a side stream, for one allocator per process.

    python3 bench/torch_call_cost.py [--allocator tidepool|caching|expandable]
        [--pairs 200000] [--batch 1000] [--lib build/libtidepool.so]

Each batch allocates and drops `batch` tensors of 1 MiB in a loop; the
median of the batches' per-pair times is printed per stream. Run it once
per allocator (TIDEPOOL_TORCH_HOOKS=0 for tidepool without the allocator
hooks) and compare: the figure includes PyTorch's own per-tensor work,
which is the same for every pluggable allocator.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", default="tidepool",
                    choices=["tidepool", "caching", "expandable"])
    ap.add_argument("--pairs", type=int, default=200000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--lib", help="libtidepool.so (else TIDEPOOL_LIB or the build tree)")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import torch_train_bench as ttb
    ttb.use_in_process(args.allocator, args.lib)
    import torch

    side = torch.cuda.Stream()
    out = {"allocator": args.allocator,
           "hooks": os.environ.get("TIDEPOOL_TORCH_HOOKS", "1")}
    for name, stream in (("default", torch.cuda.current_stream()), ("side", side)):
        with torch.cuda.stream(stream):
            for _ in range(2000):  # warm-up
                x = torch.empty(1 << 18, device="cuda")
                del x
            times = []
            for _ in range(args.pairs // args.batch):
                t0 = time.perf_counter_ns()
                for _ in range(args.batch):
                    x = torch.empty(1 << 18, device="cuda")
                    del x
                times.append((time.perf_counter_ns() - t0) / args.batch)
        torch.cuda.synchronize()
        out[name + "_ns"] = round(statistics.median(times), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
