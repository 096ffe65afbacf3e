"""Is a training step bound by the host or by the GPU, and does the
allocator change the GPU's share? Runs torch_train_bench's GPT model and
shapes with one allocator, profiles 16 steps after 15 warm-up steps (the
sum of the device activities' durations is the GPU's busy time), then times
20 steps without the profiler.

    python3 bench/torch_gpu_busy.py caching|expandable|tidepool [--lib PATH]

tidepool comes from integrations/pytorch (TIDEPOOL_LIB or --lib names the
library); TIDEPOOL_TORCH_GROWTH_SLACK and the other TIDEPOOL_TORCH_*
variables apply as usual."""
import argparse
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("allocator", choices=["caching", "expandable", "tidepool"])
    ap.add_argument("--lib", help="libtidepool.so (else $TIDEPOOL_LIB)")
    args = ap.parse_args()
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    import torch_train_bench as tb
    tb.use_in_process(args.allocator, args.lib)
    import torch
    from torch.profiler import profile, ProfilerActivity

    cfg = {"vocab": 32000, "d_model": 768, "layers": 12, "heads": 12,
           "shapes": tb.SHAPES, "dropout": 0.1}
    torch.manual_seed(1234)
    model = tb.build_model(torch, cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.Generator().manual_seed(1235)
    pick = random.Random(1236)
    vocab = cfg["vocab"]

    device = torch.device("cuda")

    def step():
        b, t = pick.choice(cfg["shapes"])
        idx = torch.randint(vocab, (b, t + 1), generator=data)
        tb.train_step(torch, model, opt, idx, device, True, vocab).item()
        torch.cuda.synchronize()

    def timed(n):
        walls = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            walls.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(walls)

    timed(15)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        profiled = timed(16)
    busy_us = sum(getattr(e, "device_time_total", 0) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA)
    plain = timed(20)
    print(f"{args.allocator}: GPU busy {busy_us / 1e3 / 16:.2f} ms a step; "
          f"median step {plain:.2f} ms ({profiled:.2f} ms under the profiler)")


if __name__ == "__main__":
    main()
