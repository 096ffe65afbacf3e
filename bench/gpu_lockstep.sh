#!/usr/bin/env bash
# One GPU call for issue 10's open question and a check of the tree on the
# driver: a Release build, issue 17's pair (bench_alloc, captures asked or
# counted, and through the interposer), the GPT loop's step times in lockstep with the
# null allocator's VMM variants (null/vmm: 2 MiB chunks; null/vmm1: one
# physical allocation a block), then the cuda-platform test suite and the
# interposer over the real driver, as far as the time allows. Everything
# goes to $OUT/gpu_lockstep.log, the step times to $OUT/lock.json.
#
# Usage (repo root): OUT=/some/dir bash bench/gpu_lockstep.sh
#   LOCK_ALLOC, LOCK_STEPS (default 200), LOCK_T (seconds, default 240),
#   BUDGET (seconds for the whole call, default 560).
# Where the machine has no zlib headers, zlib.h and zconf.h in .device/zlib.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_lockstep.log") 2>&1
T0=$SECONDS
echo "== $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
zopts=()
if [[ ! -e /usr/include/zlib.h && -e .device/zlib/zlib.h ]]; then
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  zopts=(-DZLIB_INCLUDE_DIR="$PWD/.device/zlib" -DZLIB_LIBRARY="$zlib")
fi
B=$PWD/build-gpu
if ! cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON "${zopts[@]}" \
  >"$OUT/build.txt" 2>&1 || ! cmake --build "$B" -j"$(nproc)" >>"$OUT/build.txt" 2>&1; then
  tail -40 "$OUT/build.txt"
  exit 1
fi
echo "== build done at $((SECONDS - T0)) s"
# Issue 17's pair: bench_alloc with captures asked about on every call (the
# default), counted (TIDEPOOL_CAPTURES=tidepool), and through the
# interposer (its "driver" rows are then the interposer's answers).
for cap in ask tidepool; do
  TIDEPOOL_CAPTURES=$cap TIDEPOOL_PLATFORM=cuda timeout 90 taskset -c 2-5 \
    "$B/bench_alloc" --quick --threads 1,16 >"$OUT/bench_alloc_$cap.txt" 2>&1
  echo "== bench_alloc, TIDEPOOL_CAPTURES=$cap: exit $?"
  grep -A6 "side by side in this run: driver cudaMallocAsync" \
    "$OUT/bench_alloc_$cap.txt"
done
LD_PRELOAD=$B/libtidepool_preload.so TIDEPOOL_PLATFORM=cuda timeout 90 \
  taskset -c 2-5 "$B/bench_alloc" --quick --threads 1 \
  >"$OUT/bench_alloc_preload.txt" 2>&1
echo "== bench_alloc under the interposer: exit $?"
grep -A4 "^== driver cudaMallocAsync" "$OUT/bench_alloc_preload.txt"
cc -O2 -shared -fPIC -o "$B/null_alloc.so" bench/null_alloc/null_alloc.c \
  -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda ||
  echo "== null_alloc.so did not build"
t0=$SECONDS
timeout "${LOCK_T:-240}" python3 bench/torch_lockstep.py \
  --allocators "${LOCK_ALLOC:-expandable,null,null/vmm,null/vmm1,tidepool}" \
  --steps "${LOCK_STEPS:-200}" --pin 2-5 --lib "$B/libtidepool.so" \
  --null-lib "$B/null_alloc.so" --json "$OUT/lock.json"
echo "== lockstep: exit $? after $((SECONDS - t0)) s"
cd "$B" || exit 1
left=$((${BUDGET:-560} - (SECONDS - T0) - 40))
if ((left < 60)); then
  echo "== no time left for the test suite"
  exit 0
fi
((left > 240)) && left=240
t0=$SECONDS
TIDEPOOL_PLATFORM=cuda timeout "$left" ctest -j6 --timeout 180 \
  -E 'fuzz|^test_replay|^test_trace|soak|no_platform' \
  --output-on-failure >"$OUT/ctest_cuda.txt" 2>&1
echo "== ctest, cuda: exit $? after $((SECONDS - t0)) s (limit $left)"
grep -E "tests passed|Failed|\*\*\*|Timeout" "$OUT/ctest_cuda.txt" | head -40
LD_PRELOAD=$B/libtidepool_preload.so timeout 30 src/preload/test_preload_driver cuda \
  >"$OUT/preload_driver.txt" 2>&1
echo "== test_preload_driver cuda: exit $?"
tail -3 "$OUT/preload_driver.txt"
echo "== total $((SECONDS - T0)) s"
