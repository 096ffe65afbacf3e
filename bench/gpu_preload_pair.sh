#!/usr/bin/env bash
# The same-stream pair through the CUDA runtime's names (bench/preload_pair.c)
# on the driver's pool and under tidepool-run, in alternating processes
# (the order swapped every round), then the median of each figure over the
# rounds and the driver's over tidepool's. One process cannot hold both:
# the interposer answers every call of the process it is loaded in.
#
# Usage (repo root): BUILD=build ROUNDS=5 OUT=/some/dir bash bench/gpu_preload_pair.sh
# BUILD must hold preload_pair, tidepool-run and libtidepool_preload.so (a
# build where the toolkit's runtime was found). Needs a GPU.
set -u
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
prog=$BUILD/preload_pair
[[ -x $prog && -x $BUILD/tidepool-run ]] || {
  echo "no $prog or $BUILD/tidepool-run (a build without the CUDA runtime?)"
  exit 1
}
rm -f "$OUT/pair_driver.jsonl" "$OUT/pair_tidepool.jsonl"
for ((r = 0; r < ROUNDS; r++)); do
  for side in $( ((r % 2)) && echo "tidepool driver" || echo "driver tidepool"); do
    if [[ $side == driver ]]; then
      "$prog" --json >>"$OUT/pair_driver.jsonl" || exit 1
    else
      TIDEPOOL_PRELOAD_REPORT=1 "$BUILD/tidepool-run" "$prog" --json \
        >>"$OUT/pair_tidepool.jsonl" 2>>"$OUT/pair_tidepool_report.txt" ||
        exit 1
    fi
  done
done
tail -2 "$OUT/pair_tidepool_report.txt"
python3 - "$OUT/pair_driver.jsonl" "$OUT/pair_tidepool.jsonl" <<'EOF'
import json, statistics, sys
d = [json.loads(l) for l in open(sys.argv[1])]
t = [json.loads(l) for l in open(sys.argv[2])]
print(f"{len(d)} rounds; ns, median of the rounds: driver's pool, tidepool "
      "(tidepool-run), driver / tidepool")
for k in d[0]:
    md = statistics.median(x[k] for x in d)
    mt = statistics.median(x[k] for x in t)
    print(f"  {k:24s} {md:9.1f} {mt:9.1f} {md / mt:7.1f}x")
EOF
