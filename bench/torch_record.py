#!/usr/bin/env python3
"""Live PyTorch workloads recorded for tidepool's replay, one process each
(bench/gpu_record.sh runs them on a GPU):

  train     trains a Hugging Face model with random weights, built from a
            config (no download): T5 (encoder-decoder, varying source and
            target lengths) or Llama (decoder), over varying (batch,
            sequence) shapes, bf16 autocast, AdamW, synchronizing after each
            step, under one allocator. Prints the live peak reserved and
            peak allocated; under tidepool with TIDEPOOL_TORCH_TRACE set the
            run's allocations are recorded for tidepool-replay.
  snapshot  a few steps of a small model under PyTorch's own allocator with
            torch.cuda.memory._record_memory_history, written with
            torch.cuda.memory._dump_snapshot: a real snapshot for the
            replay's tests, with the figures the replay must find in it.

    python3 bench/torch_record.py train --model t5 --allocator tidepool
    python3 bench/torch_record.py snapshot --out snap.pickle

The last line of each is "RESULT {json}".
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# allocator -> PYTORCH_CUDA_ALLOC_CONF (None: unset), as in
# bench/torch_train_bench.py.
ALLOCATORS = {
    "caching": None,
    "expandable": "expandable_segments:True",
    "cudaMallocAsync": "backend:cudaMallocAsync",
    "tidepool": None,
}

# (batch, source length, target length) for T5; (batch, length) for Llama.
T5_SHAPES = [(16, 128, 32), (8, 256, 64), (4, 512, 128), (32, 64, 16),
             (2, 1024, 256), (12, 192, 48), (6, 384, 96), (24, 96, 24)]
LLAMA_SHAPES = [(8, 128), (16, 256), (4, 512), (32, 64), (2, 1024), (12, 384),
                (24, 192), (6, 640)]


def choose_allocator(name, device):
    """Before torch is imported: the environment PyTorch reads once, or
    tidepool's pluggable allocator."""
    os.environ.pop("PYTORCH_ALLOC_CONF", None)
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if ALLOCATORS[name]:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATORS[name]
    if name == "tidepool" and device == "cuda":
        sys.path.insert(0, os.path.join(REPO, "integrations", "pytorch"))
        import tidepool_torch

        tidepool_torch.install()
        return tidepool_torch
    return None


def build(torch, model, vocab):
    import transformers

    if model == "t5":
        cfg = transformers.T5Config(
            vocab_size=vocab, d_model=768, d_kv=64, d_ff=3072, num_layers=8,
            num_decoder_layers=8, num_heads=12, dropout_rate=0.1,
            feed_forward_proj="relu", decoder_start_token_id=0,
            pad_token_id=0, eos_token_id=1)
        return transformers.T5ForConditionalGeneration(cfg)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=1024, intermediate_size=2816,
        num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
        max_position_embeddings=2048, rms_norm_eps=1e-5)
    return transformers.LlamaForCausalLM(cfg)


def train(args):
    tp = choose_allocator(args.allocator, args.device)
    import torch

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    on_gpu = args.device == "cuda"
    vocab = 32128 if args.model == "t5" else 32000
    model = build(torch, args.model, vocab).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    data = torch.Generator().manual_seed(args.seed + 1)
    pick = random.Random(args.seed + 2)
    shapes = T5_SHAPES if args.model == "t5" else LLAMA_SHAPES
    if args.quick:
        shapes = [tuple(max(1, v // 4) for v in s) for s in shapes[:4]]
    times, losses = [], []
    vmm_at_warmup = None  # tidepool's chunk maps/unmaps when warm-up ended
    for step in range(args.steps):
        if tp and on_gpu and step == args.warmup:
            vmm_at_warmup = tp.chunk_maps()
            t = tp.timing()
            vmm_at_warmup["ns"] = t["alloc_ns"] + t["free_ns"]
        shape = pick.choice(shapes)
        t0 = time.perf_counter()
        if args.model == "t5":
            b, s, t = shape
            src = torch.randint(2, vocab, (b, s), generator=data).to(device)
            tgt = torch.randint(2, vocab, (b, t), generator=data).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                out = model(input_ids=src, labels=tgt)
        else:
            b, s = shape
            ids = torch.randint(2, vocab, (b, s), generator=data).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
                out = model(input_ids=ids, labels=ids)
        loss = out.loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out
        losses.append(loss.item())
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    result = {"model": args.model, "allocator": args.allocator,
              "steps": args.steps, "torch": torch.__version__,
              "median_step_ms": 1e3 * statistics.median(times[args.warmup:] or times),
              "losses": losses}
    if on_gpu:
        if tp:
            st = tp.stats()
            result["peak_reserved"] = st["reserved_peak"]
            result["peak_allocated"] = st["used_peak"]
            result["backend"] = "tidepool"
        else:
            result["peak_reserved"] = torch.cuda.max_memory_reserved()
            result["peak_allocated"] = torch.cuda.max_memory_allocated()
            result["backend"] = torch.cuda.get_allocator_backend()
        result["ratio"] = result["peak_reserved"] / max(result["peak_allocated"], 1)
        result["gpu"] = torch.cuda.get_device_name()
        vmm = ""
        if vmm_at_warmup and args.steps > args.warmup:
            m, k = tp.chunk_maps(), args.steps - args.warmup
            result["maps_per_step"] = (m["maps"] - vmm_at_warmup["maps"]) / k
            result["unmaps_per_step"] = (m["unmaps"] - vmm_at_warmup["unmaps"]) / k
            vmm = (f", chunk maps/unmaps per step after warm-up "
                   f"{result['maps_per_step']:.1f}/{result['unmaps_per_step']:.1f}")
            t = tp.timing()
            if t["alloc_ns"]:  # TIDEPOOL_TORCH_TIMING=1
                ms = (t["alloc_ns"] + t["free_ns"] - vmm_at_warmup["ns"]) / k / 1e6
                result["tidepool_ms_per_step"] = ms
                vmm += f", {ms:.2f} ms a step in tidepool"
        print(f"{args.model} under {args.allocator}: median step "
              f"{result['median_step_ms']:.2f} ms, peak reserved "
              f"{result['peak_reserved'] / 2**20:.1f} MiB / peak allocated "
              f"{result['peak_allocated'] / 2**20:.1f} MiB = {result['ratio']:.4f}"
              f"{vmm}", flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def snapshot(args):
    """A small transformer encoder and an MLP over three shapes: a few
    thousand events, with Python stacks, as a user would record them."""
    import torch

    if not torch.cuda.is_available():
        print("snapshot: no CUDA device", file=sys.stderr)
        return 1
    torch.cuda.init()
    torch.manual_seed(args.seed)
    # From the very start, so that the history covers every segment and the
    # replay's figure for PyTorch's allocator must equal its own peak.
    torch.cuda.memory._record_memory_history(max_entries=args.max_entries)
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=8,
                                             dim_feedforward=1024,
                                             batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 2),
                                torch.nn.Linear(256, 256)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (b, t) in enumerate([(8, 64), (4, 200), (16, 32), (8, 128)]):
        x = torch.randn(b, t, 256, device=dev)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(args.out)
    torch.cuda.memory._record_memory_history(enabled=None)
    import pickle

    with open(args.out, "rb") as f:
        snap = pickle.load(f)
    events = max(snap["device_traces"], key=len)
    counts = {}
    for e in events:
        counts[e["action"]] = counts.get(e["action"], 0) + 1
    result = {"path": args.out, "bytes": os.path.getsize(args.out),
              "torch": torch.__version__, "events": counts,
              "max_memory_reserved": torch.cuda.max_memory_reserved(),
              "max_memory_allocated": torch.cuda.max_memory_allocated(),
              "keys": sorted(snap.keys()),
              "entry_keys": sorted({k for e in events for k in e})}
    print(f"snapshot {args.out}: {result['bytes']} bytes, events {counts}, "
          f"max_memory_reserved {result['max_memory_reserved']}", flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a Hugging Face model under one allocator")
    t.add_argument("--model", choices=["t5", "llama"], default="t5")
    t.add_argument("--allocator", choices=list(ALLOCATORS), default="tidepool")
    t.add_argument("--steps", type=int, default=60)
    t.add_argument("--warmup", type=int, default=3)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu only checks the script where there is no GPU")
    t.add_argument("--quick", action="store_true", help="small shapes")
    s = sub.add_parser("snapshot", help="record a PyTorch memory snapshot")
    s.add_argument("--out", required=True)
    s.add_argument("--max-entries", type=int, default=200000)
    s.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    return train(args) if args.cmd == "train" else snapshot(args)


if __name__ == "__main__":
    sys.exit(main())
