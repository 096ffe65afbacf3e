#!/usr/bin/env bash
# Records live PyTorch runs on a GPU for the replay's model of a device that
# runs behind the host, and a real PyTorch memory snapshot for test/data:
#   build     tidepool (Release) and tidepool-replay;
#   gpt       bench/torch_train_bench.py under tidepool (one round, 120
#             steps) with TIDEPOOL_TORCH_TRACE and the completion column;
#   t5        bench/torch_record.py train --model t5, the same way;
#   llama     bench/torch_record.py train --model llama, the same way;
#   snapshot  bench/torch_record.py snapshot under PyTorch's own allocator,
#             replayed at once: the replay's figure for PyTorch's allocator
#             must equal torch.cuda.max_memory_reserved();
#   calibrate for each recorded trace: its lag distribution
#             (--measure-lag), then its replay at several --lag values next
#             to the live ratio of its run.
# Everything goes to $OUT: gpu_record.log (the summary is its end),
# <model>.csv.gz (the traces), <model>.json, snapshot_gpu.pickle.gz,
# calibration.txt and calibration.json.
#
# Usage (repo root): OUT=/some/dir bash bench/gpu_record.sh
#   STEPS="gpt t5 snapshot calibrate" runs only those (build always runs);
#   ALLOCATORS="caching expandable cudaMallocAsync tidepool" also runs the
#   Hugging Face models under PyTorch's allocators (live figures only);
#   LAGS="0 1 2 4 8 16 32 64 128 256" are the lags replayed.
# About 5 minutes on an H200 (each run well under 2 minutes).
set -u
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-/tmp/tidepool-record-build}
STEPS=${STEPS:-gpt t5 llama snapshot calibrate}
ALLOCATORS=${ALLOCATORS:-tidepool}
LAGS=${LAGS:-0 1 2 4 8 16 32 64 128 256}
# An event every Kth operation of a stream gives the completion column.
EVERY=${EVERY:-1}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_record.log") 2>&1
REPO=$PWD
echo "== $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python3 -c "import torch, transformers; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__)"

want() { [[ " $STEPS " == *" $1 "* ]]; }
summary=()
note() {
  summary+=("$1")
  echo "$1"
}

# ---- build ----------------------------------------------------------------
zopts=()
if [[ ! -e /usr/include/zlib.h && -e .device/zlib/zlib.h ]]; then
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  zopts=(-DZLIB_INCLUDE_DIR="$PWD/.device/zlib" -DZLIB_LIBRARY="$zlib")
fi
echo "== build"
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON \
  -DTP_BUILD_TESTS=OFF "${zopts[@]}" >"$OUT/build.txt" 2>&1 ||
  ! cmake --build "$BUILD" -j"$(nproc)" --target tidepool tidepool-replay \
    >>"$OUT/build.txt" 2>&1; then
  tail -40 "$OUT/build.txt"
  exit 1
fi
export TIDEPOOL_LIB=$BUILD/libtidepool.so
REPLAY=$BUILD/tidepool-replay

# Runs one recorded training run: $1 the name, then the command. The trace
# is written uncompressed by the library, then gzip'd.
record() {
  local name=$1
  shift
  local trace="$OUT/$name.csv"
  rm -f "$trace" "$trace.gz"
  echo
  echo "== $name: $*"
  local t0=$SECONDS
  TIDEPOOL_TORCH_TRACE="$trace" TIDEPOOL_TORCH_TRACE_COMPLETION=$EVERY \
    timeout 300 "$@" | tee "$OUT/$name.out"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  if [[ $rc -ne 0 || ! -s "$trace" ]]; then
    note "$name: FAILED (exit $rc; trace $(wc -l <"$trace" 2>/dev/null || echo 0) lines)"
    return 1
  fi
  gzip -f "$trace"
  note "$name: recorded $(zcat "$trace.gz" | wc -l) lines into $trace.gz"
}

# The live ratio of a run, from its RESULT or JSON line.
live_ratio() {
  python3 - "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("RESULT "):
        r = json.loads(line[7:])
    elif line.startswith("JSON "):
        r = json.loads(line[5:])["summary"][0]
    else:
        continue
    print("%.4f %d %d" % (r["peak_reserved"] / r["peak_allocated"],
                          r["peak_reserved"], r["peak_allocated"]))
EOF
}

# ---- gpt ------------------------------------------------------------------
if want gpt; then
  record gpt python3 bench/torch_train_bench.py --allocators tidepool \
    --rounds 1 --steps 120 --json "$OUT/gpt.json" &&
    note "gpt: live (ratio reserved allocated) $(live_ratio "$OUT/gpt.out")"
fi

# ---- Hugging Face models --------------------------------------------------
for model in t5 llama; do
  want $model || continue
  record $model python3 bench/torch_record.py train --model $model \
    --allocator tidepool --steps 60 &&
    note "$model: live (ratio reserved allocated) $(live_ratio "$OUT/$model.out")"
  for alloc in $ALLOCATORS; do
    [[ $alloc == tidepool ]] && continue
    echo "== $model under $alloc"
    timeout 300 python3 bench/torch_record.py train --model $model \
      --allocator "$alloc" --steps 60 | tee "$OUT/$model-$alloc.out"
    note "$model under $alloc: live (ratio reserved allocated) $(live_ratio "$OUT/$model-$alloc.out")"
  done
done

# ---- snapshot -------------------------------------------------------------
if want snapshot; then
  echo
  echo "== snapshot"
  snap="$OUT/snapshot_gpu.pickle"
  rm -f "$snap" "$snap.gz"
  if timeout 300 python3 bench/torch_record.py snapshot --out "$snap" |
    tee "$OUT/snapshot.out" && [[ -s "$snap" ]]; then
    gzip -f "$snap"
    "$REPLAY" --no-progress --platform host "$snap.gz"
    "$REPLAY" --no-progress --platform host --json "$snap.gz" >"$OUT/snapshot_replay.json"
    verdict=$(python3 - "$OUT/snapshot.out" "$OUT/snapshot_replay.json" <<'EOF'
import json, sys
torch_side = next(json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT "))
replay = json.loads(open(sys.argv[2]).read().splitlines()[0])
want, got = torch_side["max_memory_reserved"], replay.get("user_peak_reserved")
print(f"{'MATCH' if want == got else 'MISMATCH'}: PyTorch's peak reserved "
      f"{want}, the replay's figure for it {got}; peak used in the replay "
      f"{replay['peak_used']} (PyTorch's max allocated {torch_side['max_memory_allocated']}, "
      f"rounded blocks); {replay['allocs']} allocations, events {torch_side['events']}; "
      f"{torch_side['bytes']} bytes before gzip")
EOF
    )
    note "snapshot: $verdict"
    note "snapshot: $(du -h "$snap.gz" | cut -f1) in $snap.gz (for test/data)"
  else
    note "snapshot: FAILED"
  fi
fi

# ---- calibrate ------------------------------------------------------------
if want calibrate; then
  echo
  echo "== calibrate: the lag of each live run, then the replay at several lags"
  traces=()
  for name in gpt t5 llama; do
    [[ -s "$OUT/$name.csv.gz" ]] && traces+=("$OUT/$name.csv.gz")
  done
  if [[ ${#traces[@]} -gt 0 ]]; then
    "$REPLAY" --measure-lag "${traces[@]}" | tee "$OUT/measure_lag.txt"
    "$REPLAY" --measure-lag --json "${traces[@]}" >"$OUT/measure_lag.json"
    : >"$OUT/calibration.json"
    for lag in $LAGS; do
      TIDEPOOL_HOST_DEVICE_MEMORY=140G timeout 600 "$REPLAY" --no-progress \
        --platform host --json --lag "$lag" "${traces[@]}" >>"$OUT/calibration.json" ||
        echo "replay at lag $lag failed"
    done
    python3 - "$OUT" "$LAGS" <<'EOF' | tee "$OUT/calibration.txt"
import json, os, sys
out, lags = sys.argv[1], [int(x) for x in sys.argv[2].split()]
rows = [json.loads(l) for l in open(os.path.join(out, "calibration.json")) if l.strip()]
measured = {json.loads(l)["trace"]: json.loads(l)
            for l in open(os.path.join(out, "measure_lag.json")) if l.strip()}
print("replay ratio (peak reserved / peak used) by --lag, next to the live run")
print(f"{'trace':<8} {'live':>7} {'lag p50/p90':>12} " + " ".join(f"{l:>7}" for l in lags)
      + "  closest")
for name in sorted({r["trace"] for r in rows}):
    live = None
    path = os.path.join(out, f"{name}.out")
    for line in open(path) if os.path.exists(path) else []:
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            live = r["peak_reserved"] / r["peak_allocated"]
        elif line.startswith("JSON "):
            r = json.loads(line[5:])["summary"][0]
            live = r["peak_reserved"] / r["peak_allocated"]
    by = {r["lag"]: r["ratio"] for r in rows if r["trace"] == name}
    m = measured.get(name, {})
    best = min(by, key=lambda l: abs(by[l] - live)) if live and by else None
    print(f"{name:<8} {live or 0:>7.4f} {m.get('lag_median', '-'):>5}/{m.get('lag_p90', '-'):<6} "
          + " ".join(f"{by.get(l, 0):>7.4f}" for l in lags)
          + (f"  lag {best} ({100 * (by[best] / live - 1):+.2f}%)" if best is not None else ""))
EOF
    summary+=("$(cat "$OUT/measure_lag.txt" "$OUT/calibration.txt")")
  else
    note "calibrate: no trace recorded"
  fi
fi

echo
echo "== summary ($(date -u +%FT%TZ))"
printf '%s\n' "${summary[@]}"
