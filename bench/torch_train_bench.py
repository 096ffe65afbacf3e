#!/usr/bin/env python3
"""Trains a small GPT-style language model under four CUDA allocators, each in
its own process, and compares them: PyTorch's caching allocator, the same with
expandable_segments:True, PyTorch's backend:cudaMallocAsync (the CUDA
driver's pool), and tidepool through integrations/pytorch/tidepool_torch.py.

Every process trains the same model (random weights, same seed) on the same
random token batches, whose (batch, sequence) shapes change from step to step
so that the allocators see varied sizes (--model hf-bert or hf-gpt2: a model of
the transformers package instead, same size, random weights). Each reports the median step time,
its peak reserved and peak allocated memory, the device's own peak (from
cudaMemGetInfo) and the loss of every step; the parent checks that the four
loss sequences are identical step by step, since an allocator must change
nothing but memory and time, and prints a table and a JSON line.

    python3 bench/torch_train_bench.py                  # full run
    python3 bench/torch_train_bench.py --allocators expandable,tidepool,tidepool/25000 \
        --rounds 6 --pin 2-5                            # a growth slack, pinned
    python3 bench/torch_train_bench.py --quick          # a smaller, shorter one
    TIDEPOOL_LIB=build/libtidepool.so python3 bench/torch_train_bench.py

What "allocated" means differs by allocator, as each counts it: the caching
allocator (with or without expandable segments) counts its blocks, rounded
up to 512 bytes; backend:cudaMallocAsync reports the driver pool's used-memory
watermark; tidepool reports its pool's used watermark, which counts the bytes
asked for. The device column is the same measure for all four.
"""

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MiB = 1 << 20

# name -> PYTORCH_CUDA_ALLOC_CONF (None: unset). PyTorch 2.9 to 2.11 honour
# the older variable name for these settings where PYTORCH_ALLOC_CONF can be
# ignored, so that one is used and the newer one removed from the child's
# environment.
ALLOCATORS = {
    "caching": None,
    "expandable": "expandable_segments:True",
    "cudaMallocAsync": "backend:cudaMallocAsync",
    "tidepool": None,
    # tidepool with no code change: the cudaMallocAsync backend, answered by
    # tidepool through the interposer (tidepool-run); needs TIDEPOOL_PRELOAD_LIB
    # (libtidepool_preload.so), so it runs only when asked for.
    "tidepool-run": "backend:cudaMallocAsync",
}
# What torch.cuda.get_allocator_backend() must answer in each child.
BACKENDS = {
    "caching": "native",
    "expandable": "native",
    "cudaMallocAsync": "cudaMallocAsync",
    "tidepool": "pluggable",
    "tidepool-run": "cudaMallocAsync",
}



def base(name):
    """An allocator's kind: "tidepool/N" is tidepool with the growth slack
    N (parts per million, TIDEPOOL_TORCH_GROWTH_SLACK), "tidepool/nohooks"
    tidepool without the allocator hooks (TIDEPOOL_TORCH_HOOKS=0: every
    allocation asks the driver whether its stream captures), "tidepool/lib2"
    tidepool from the library given by --lib2 (two builds side by side)."""
    return name.split("/", 1)[0]


def use_in_process(allocator, lib=None):
    """Makes this process's PyTorch allocate with `allocator` ("caching",
    "expandable" or "tidepool"); before torch touches the GPU."""
    if allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator == "tidepool":
        if lib:
            os.environ["TIDEPOOL_LIB"] = os.path.abspath(lib)
        sys.path.insert(0, os.path.join(REPO, "integrations", "pytorch"))
        import tidepool_torch
        tidepool_torch.install()


def variant_ok(name):
    """Whether a name with a "/" is one base() explains."""
    v = name.split("/", 1)[1]
    return base(name) == "tidepool" and (v.isdigit() or v in ("nohooks", "lib2"))


# (batch, sequence) shapes; each step draws one with a seeded generator.
SHAPES = [(8, 128), (16, 256), (4, 512), (32, 64), (2, 1024), (12, 384),
          (24, 192), (6, 640)]
QUICK_SHAPES = [(8, 64), (4, 128), (16, 32), (2, 256), (6, 96)]


# ---------------------------------------------------------------------------
# The child: one allocator, one training run.
# ---------------------------------------------------------------------------

# The models cfg["model"] names: "gpt", this file's own decoder (the
# default), or a model of the transformers package built from a config with
# random weights, of the same width, depth and vocabulary: "hf-bert" (BERT
# with its masked-LM head, an encoder) or "hf-gpt2". Every one maps token
# ids (B, T) to logits (B, T, vocab), which train_step scores against the
# next tokens.
MODELS = ("gpt", "hf-bert", "hf-gpt2")


def build_hf_model(torch, cfg, kind):
    """A transformers model with eager attention (the same kernels in every
    process, so that losses compare step by step), wrapped to return its
    logits."""
    import transformers
    d, drop = cfg["d_model"], cfg["dropout"]
    longest = max(t for _, t in cfg["shapes"])
    if kind == "hf-bert":
        conf = transformers.BertConfig(
            vocab_size=cfg["vocab"], hidden_size=d,
            num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
            intermediate_size=4 * d, max_position_embeddings=longest,
            hidden_dropout_prob=drop, attention_probs_dropout_prob=drop)
        make = transformers.BertForMaskedLM
    else:
        conf = transformers.GPT2Config(
            vocab_size=cfg["vocab"], n_embd=d, n_layer=cfg["layers"],
            n_head=cfg["heads"], n_positions=longest, resid_pdrop=drop,
            embd_pdrop=drop, attn_pdrop=drop)
        make = transformers.GPT2LMHeadModel
    conf._attn_implementation = "eager"
    inner = make(conf)

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, idx):
            return self.m(input_ids=idx).logits

    return Logits(inner)


def build_model(torch, cfg):
    """A GPT-2-style decoder: learned positions, pre-norm blocks, attention
    written out with matmuls (deterministic, and its T x T score tensors
    are the allocations that vary most with the shape), tied output head.
    Or another of MODELS, as cfg["model"] says."""
    kind = cfg.get("model", "gpt")
    if kind != "gpt":
        return build_hf_model(torch, cfg, kind)
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d, heads, drop):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)
            self.drop = nn.Dropout(drop)

        def forward(self, x, mask):
            B, T, C = x.shape
            h = self.heads
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, h, C // h).transpose(1, 2)
            k = k.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
            att = att.masked_fill(mask[:T, :T], float("-inf"))
            att = self.drop(F.softmax(att, dim=-1))
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.drop(self.proj(y))
            return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(self, vocab, d, layers, heads, max_seq, drop):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(max_seq, d)
            self.drop = nn.Dropout(drop)
            self.blocks = nn.ModuleList(Block(d, heads, drop) for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight
            # True above the diagonal: the future positions a token may not see.
            mask = torch.ones(max_seq, max_seq, dtype=torch.bool).triu(1)
            self.register_buffer("mask", mask, persistent=False)
            self.apply(self._init)

        @staticmethod
        def _init(m):
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

        def forward(self, idx):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.drop(self.tok(idx) + self.pos(pos))
            for b in self.blocks:
                x = b(x, self.mask)
            return self.head(self.ln(x))

    return GPT(cfg["vocab"], cfg["d_model"], cfg["layers"], cfg["heads"],
               max(t for _, t in cfg["shapes"]), cfg["dropout"])


def train_step(torch, model, opt, idx, device, amp, vocab):
    """One optimizer step on the token batch idx (inputs and shifted
    targets); returns the loss, not yet waited for."""
    F = torch.nn.functional
    x = idx[:, :-1].to(device)
    y = idx[:, 1:].to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(x)
    loss = F.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def training(torch, cfg, device):
    """The model, its optimizer and a source of (batch, sequence, tokens),
    seeded from cfg and with PyTorch's deterministic settings: the same in
    every process given the same cfg, so that their losses can be compared
    step by step (here and in torch_lockstep.py)."""
    torch.manual_seed(cfg["seed"])
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build_model(torch, cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.Generator().manual_seed(cfg["seed"] + 1)
    pick = random.Random(cfg["seed"] + 2)

    def next_batch():
        b, t = pick.choice(cfg["shapes"])
        return b, t, torch.randint(cfg["vocab"], (b, t + 1), generator=data)

    return model, opt, next_batch


def child(args):
    cfg = json.loads(args.config)
    on_gpu = cfg["device"] == "cuda"
    if args.pin:
        # The same cores for every run, so that runs differ by allocator and
        # not by where the scheduler put the Python thread.
        os.sched_setaffinity(0, parse_cpus(args.pin))
    tidepool = base(args.child) == "tidepool"
    if tidepool and on_gpu:
        # Before torch initialises CUDA: the allocator is chosen once.
        sys.path.insert(0, os.path.join(REPO, "integrations", "pytorch"))
        import tidepool_torch
        tidepool_torch.install()
    import torch

    device = torch.device(cfg["device"])
    base_used = 0
    if on_gpu:
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info()
        base_used = total - free

    model, opt, next_batch = training(torch, cfg, device)
    amp = cfg["amp"] and on_gpu
    vocab = cfg["vocab"]

    losses, times, shapes = [], [], []
    dev_peak = 0
    # Chunks mapped and unmapped by tidepool's pool at each step's end: what
    # a step spends on VMM calls once the pool has grown.
    vmm = []
    for _ in range(cfg["steps"]):
        b, t, idx = next_batch()
        t0 = time.perf_counter()
        loss = train_step(torch, model, opt, idx, device, amp, vocab)
        losses.append(loss.item())  # waits for the step's work
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        shapes.append([b, t])
        if on_gpu:
            free, total = torch.cuda.mem_get_info()
            dev_peak = max(dev_peak, total - free - base_used)
        if tidepool:
            m = tidepool_torch.chunk_maps()
            t = tidepool_torch.timing()
            vmm.append([m["maps"], m["unmaps"], t["alloc_ns"] + t["free_ns"],
                        t["allocs"] + t["frees"], t["alloc_ns"], t["allocs"]])

    result = {
        "allocator": args.child,
        "steps": cfg["steps"],
        "times_s": times,
        "losses": losses,
        "shapes": shapes,
        "torch": torch.__version__,
    }
    if on_gpu:
        result["backend"] = torch.cuda.get_allocator_backend()
        result["cuda"] = torch.version.cuda
        result["gpu"] = torch.cuda.get_device_name()
        result["device_peak"] = dev_peak
        result["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        if tidepool:
            st = tidepool_torch.stats()
            result["peak_reserved"] = st["reserved_peak"]
            result["peak_allocated"] = st["used_peak"]
            result["tidepool_lib"] = tidepool_torch.library_path()
            result["vmm_per_step"] = vmm
        else:
            result["peak_reserved"] = torch.cuda.max_memory_reserved()
            result["peak_allocated"] = torch.cuda.max_memory_allocated()
            if result["backend"] == "native":
                # Confirms that the setting took (PyTorch has ignored some
                # spellings of the variable silently).
                try:
                    settings = torch.cuda.memory._snapshot().get("allocator_settings", {})
                    result["expandable_segments"] = settings.get("expandable_segments")
                except Exception:  # a private API: absent is no failure
                    result["expandable_segments"] = None
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------
# The parent: one child per allocator (and round), then the comparison.
# ---------------------------------------------------------------------------

def child_env(name, args):
    """(env, None): the environment of a child that trains under allocator
    `name`; (None, why) where it cannot run."""
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if ALLOCATORS[base(name)]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATORS[base(name)]
    if base(name) == "tidepool" and "/" in name:
        v = name.split("/", 1)[1]
        if v == "nohooks":
            env["TIDEPOOL_TORCH_HOOKS"] = "0"
        elif v == "lib2":
            if not getattr(args, "lib2", None):
                return None, "tidepool/lib2 needs --lib2"
        else:
            env["TIDEPOOL_TORCH_GROWTH_SLACK"] = v
    # cuBLAS is deterministic on one stream only with a fixed workspace.
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if args.lib:
        env["TIDEPOOL_LIB"] = os.path.abspath(args.lib)
    if name == "tidepool/lib2":
        env["TIDEPOOL_LIB"] = os.path.abspath(args.lib2)
    if name == "tidepool-run":
        lib = os.environ.get("TIDEPOOL_PRELOAD_LIB")
        if not lib or not os.path.exists(lib):
            return None, "tidepool-run needs TIDEPOOL_PRELOAD_LIB (libtidepool_preload.so)"
        env["LD_PRELOAD"] = os.path.abspath(lib) + (
            ":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    return env, None


def run_child(name, cfg, args):
    env, err = child_env(name, args)
    if err:
        return None, err
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name,
           "--config", json.dumps(cfg)] + (["--pin", args.pin] if args.pin else [])
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.timeout} s"
    wall = time.time() - t0
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            r["wall_s"] = wall
            return r, None
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
    return None, f"exit {proc.returncode}, no result; last lines:\n{tail}"


def summarise(name, runs, warmup):
    """Pools the timed steps of an allocator's rounds; memory from the
    round with the highest peak reserved (they agree in practice)."""
    times = [t for r in runs for t in r["times_s"][warmup:]]
    worst = max(runs, key=lambda r: r.get("peak_reserved", 0))
    s = {
        "allocator": name,
        "backend": worst.get("backend", "-"),
        "median_step_ms": 1e3 * statistics.median(times) if times else None,
        "rounds": len(runs),
        "peak_reserved": worst.get("peak_reserved", 0),
        "peak_allocated": worst.get("peak_allocated", 0),
        "device_peak": max(r.get("device_peak", 0) for r in runs),
    }
    # None (null in JSON) where nothing was measured, as on --device cpu.
    s["ratio"] = (s["peak_reserved"] / s["peak_allocated"]
                  if s["peak_allocated"] else None)
    if "expandable_segments" in worst:
        s["expandable_segments"] = worst["expandable_segments"]
    return s


def parse_cpus(text):
    """The CPUs of a list such as "2-5,8"."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def round_medians(runs, warmup):
    """Each round's median step (ms), in round order."""
    return [1e3 * statistics.median(r["times_s"][warmup:] or r["times_s"])
            for r in runs]


def first_mismatch(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def gpu_facts():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def parent(args):
    if args.quick:
        cfg = dict(vocab=8192, d_model=256, layers=4, heads=4, shapes=QUICK_SHAPES)
        steps, rounds = 40, 1
    else:
        cfg = dict(vocab=32000, d_model=768, layers=12, heads=12, shapes=SHAPES)
        steps, rounds = 300, 2
    cfg.update(seed=args.seed, dropout=0.1, amp=not args.no_amp, device=args.device,
               model=args.model)
    cfg["steps"] = args.steps or steps
    rounds = args.rounds or rounds
    for k in ("vocab", "d_model", "layers", "heads"):
        if getattr(args, k):
            cfg[k] = getattr(args, k)
    warmup = min(args.warmup, cfg["steps"] // 2)
    names = (args.allocators.split(",") if args.allocators
             else [n for n in ALLOCATORS if n != "tidepool-run"])
    for n in names:
        if base(n) not in ALLOCATORS or ("/" in n and not variant_ok(n)):
            sys.exit(f"unknown allocator {n!r}; known: {', '.join(ALLOCATORS)}, "
                     "tidepool/SLACK, tidepool/nohooks, tidepool/lib2")

    print(f"== torch_train_bench: model {cfg['model']}, {cfg['layers']} layers, "
          f"d_model {cfg['d_model']}, "
          f"{cfg['heads']} heads, vocab {cfg['vocab']}, {len(cfg['shapes'])} shapes, "
          f"{cfg['steps']} steps x {rounds} round(s), warmup {warmup}, "
          f"{'bf16 autocast' if cfg['amp'] and cfg['device'] == 'cuda' else 'fp32'}, "
          f"device {cfg['device']}")
    facts = gpu_facts() if cfg["device"] == "cuda" else None
    if facts:
        print(f"== GPU: {facts}")

    runs = {n: [] for n in names}
    errors = {}
    for rnd in range(rounds):
        # Alternate the order between rounds so that no allocator always
        # runs first on a cold GPU.
        order = names if rnd % 2 == 0 else names[::-1]
        for n in order:
            r, err = run_child(n, cfg, args)
            if err:
                errors.setdefault(n, []).append(err)
                print(f"[round {rnd + 1}/{rounds}] {n}: FAILED: {err}", flush=True)
                continue
            runs[n].append(r)
            med = 1e3 * statistics.median(r["times_s"][warmup:] or r["times_s"])
            mem = ""
            if "peak_reserved" in r:
                mem = (f", reserved {r['peak_reserved'] / MiB:.0f} MiB / allocated "
                       f"{r['peak_allocated'] / MiB:.0f} MiB")
            vmm = ""
            if warmup > 0 and len(r.get("vmm_per_step") or []) > warmup:
                # Chunk maps and unmaps over the steps after the warm-up.
                first, last = r["vmm_per_step"][warmup - 1], r["vmm_per_step"][-1]
                k = len(r["vmm_per_step"]) - warmup
                vmm = (f", chunk maps/unmaps per step after warm-up "
                       f"{(last[0] - first[0]) / k:.1f}/{(last[1] - first[1]) / k:.1f}")
                if len(last) > 2 and last[2]:
                    # Where TIDEPOOL_TORCH_TIMING=1: host time in its calls.
                    calls = (last[3] - first[3]) / k
                    vmm += (f", {(last[2] - first[2]) / k / 1e6:.2f} ms a step in tidepool"
                            f" ({calls:.0f} calls, {(last[2] - first[2]) / k / max(calls, 1):.0f} ns"
                            f" each; allocations {(last[4] - first[4]) / max(last[5] - first[5], 1):.0f} ns)")
            print(f"[round {rnd + 1}/{rounds}] {n}: median step {med:.2f} ms{mem}, "
                  f"backend {r.get('backend', '-')}, {r['wall_s']:.0f} s{vmm}", flush=True)

    # Losses: every run against the first run of the first allocator.
    ref_name = next((n for n in names if runs[n]), None)
    ref = runs[ref_name][0]["losses"] if ref_name else []
    mismatches = {}
    for n in names:
        for i, r in enumerate(runs[n]):
            m = first_mismatch(ref, r["losses"])
            if m is not None:
                a = ref[m] if m < len(ref) else None
                b = r["losses"][m] if m < len(r["losses"]) else None
                mismatches[f"{n}#{i + 1}"] = {"step": m, "reference": a, "got": b}
    backend_wrong = {n: runs[n][0].get("backend") for n in names
                     if runs[n] and cfg["device"] == "cuda"
                     and runs[n][0].get("backend") != BACKENDS[base(n)]}
    expandable_off = [n for n in names if n == "expandable" and runs[n]
                      and runs[n][0].get("expandable_segments") is False]

    summary = [summarise(n, runs[n], warmup) for n in names if runs[n]]
    by = {s["allocator"]: s for s in summary}

    # The table, then the verdicts, then one JSON line: the tail is the report.
    print()
    print(f"{'allocator':<16} {'backend':<16} {'step ms':>8} {'reserved':>10} "
          f"{'allocated':>10} {'res/alloc':>9} {'device':>10}  losses")
    for n in names:
        if n not in by:
            print(f"{n:<16} FAILED ({len(errors.get(n, []))} run(s))")
            continue
        s = by[n]
        same = "identical" if not any(k.startswith(n + "#") for k in mismatches) \
            else "DIFFER"
        print(f"{n:<16} {s['backend']:<16} {s['median_step_ms']:>8.2f} "
              f"{s['peak_reserved'] / MiB:>6.0f} MiB {s['peak_allocated'] / MiB:>6.0f} MiB "
              f"{s['ratio'] or 0:>9.3f} {s['device_peak'] / MiB:>6.0f} MiB  {same}")
    print(f"(step ms: median over steps {warmup + 1}..{cfg['steps']} of every round; "
          f"reserved/allocated: peaks as each allocator counts them; device: peak "
          f"of cudaMemGetInfo's used memory above the process's start)")

    # Round by round: a run of the same allocator can differ from the next
    # by more than allocators differ, so each round's tidepool runs are also
    # set against the round's best PyTorch allocator, and the spread of
    # those ratios says what the medians alone cannot.
    torch_runs = [n for n in names if base(n) != "tidepool" and runs[n]]
    by_round = {n: round_medians(runs[n], warmup) for n in names if runs[n]}
    if rounds > 1 and by_round:
        print("median step by round (ms): " + "; ".join(
            f"{n} " + " ".join(f"{m:.1f}" for m in v) for n, v in by_round.items()))
        for n in names:
            if base(n) != "tidepool" or n not in by_round or not torch_runs:
                continue
            k = min(len(by_round[n]), *(len(by_round[t]) for t in torch_runs))
            ratios = sorted(by_round[n][i] / min(by_round[t][i] for t in torch_runs)
                            for i in range(k))
            if ratios:
                print(f"{n}: step against the round's best PyTorch allocator: median "
                      f"{statistics.median(ratios):.3f}x, from {ratios[0]:.3f}x to "
                      f"{ratios[-1]:.3f}x over {k} rounds")

    ok = not errors and not mismatches and not backend_wrong and not expandable_off
    steps_total = cfg["steps"]
    if mismatches:
        k, v = next(iter(mismatches.items()))
        print(f"LOSSES DIFFER: {len(mismatches)} run(s); first: {k} at step {v['step']}: "
              f"{v['got']!r} != {v['reference']!r} ({ref_name})")
    elif summary:
        print(f"losses: identical step by step in all {sum(len(runs[n]) for n in names)} "
              f"runs ({steps_total} steps each)")
    if backend_wrong:
        print(f"WRONG BACKEND: {backend_wrong} (expected {BACKENDS})")
    if expandable_off:
        print("WRONG SETTING: expandable_segments is off in the expandable run")
    verdict = {}
    torch_names = [n for n in ("caching", "expandable", "cudaMallocAsync") if n in by]
    if "tidepool" in by and torch_names:
        best = min(torch_names, key=lambda n: by[n]["median_step_ms"])
        t = by["tidepool"]
        verdict = {
            "tidepool_step_vs_best": t["median_step_ms"] / by[best]["median_step_ms"],
            "best_pytorch": best,
            "tidepool_ratio": t["ratio"],
        }
        print(f"tidepool: step time {verdict['tidepool_step_vs_best']:.3f}x the best of "
              f"PyTorch's ({best}, {by[best]['median_step_ms']:.2f} ms); reserved/allocated "
              f"{t['ratio'] or 0:.3f} (goals: step time <= 1.0x, ratio <= 1.03)")

    report = {
        "bench": "torch_train_bench",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": facts,
        "torch": next((runs[n][0]["torch"] for n in names if runs[n]), None),
        "cuda": next((runs[n][0].get("cuda") for n in names if runs[n]), None),
        "config": cfg,
        "rounds": rounds,
        "warmup": warmup,
        "summary": summary,
        "losses_identical": not mismatches and bool(summary),
        "mismatches": mismatches,
        "errors": {k: [e.splitlines()[-1] for e in v] for k, v in errors.items()},
        "verdict": verdict,
        "ok": ok,
    }
    if args.json:
        full = dict(report, runs=runs)
        with open(args.json, "w") as f:
            json.dump(full, f, indent=1)
    print("JSON " + json.dumps(report, separators=(",", ":")))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, help="training steps per run (default 300; "
                    "--quick: 40)")
    ap.add_argument("--quick", action="store_true",
                    help="a smaller model, shorter shapes, 40 steps, one round")
    ap.add_argument("--rounds", type=int,
                    help="runs per allocator, interleaved (default 2; --quick: 1)")
    ap.add_argument("--warmup", type=int, default=10,
                    help="steps left out of the median step time (default 10)")
    ap.add_argument("--allocators", help="comma-separated subset of: "
                    + ",".join(ALLOCATORS) + "; tidepool/N is tidepool with "
                    "the growth slack N (parts per million)")
    ap.add_argument("--lib", help="libtidepool.so to use (else $TIDEPOOL_LIB or "
                    "the module's search)")
    ap.add_argument("--lib2", help="a second libtidepool.so, for tidepool/lib2")
    ap.add_argument("--json", help="also write the full results (with every loss "
                    "and step time) to this file")
    ap.add_argument("--pin", help="CPUs every run is bound to, e.g. 2-5 (default: "
                    "wherever the scheduler puts it)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--model", default="gpt", choices=MODELS,
                    help="what every run trains: this file's GPT (default), or a "
                    "transformers model with random weights")
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--d-model", dest="d_model", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--no-amp", action="store_true", help="fp32 instead of bf16 autocast")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu only checks this script where there is no GPU")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per child")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
