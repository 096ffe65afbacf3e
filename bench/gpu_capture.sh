#!/usr/bin/env bash
# Stream capture on a GPU machine: builds tidepool, runs test_capture on the
# cuda platform (its last test asks the driver itself the questions whose
# answers CUDA's documentation leaves open), the graph benchmark (tidepool's
# graph, the driver's capture around tidepool's allocations, the driver's
# own memory nodes, and four graphs that tell apart what empty nodes and a
# user object cost a launch; 10,000 launches each, checked byte for byte),
# and the allocation benchmark's quick run (the cost the capture question,
# one cuStreamIsCapturing, adds to tp_malloc_async and tp_free_async on
# cuda). Logs go to $OUT; a summary ends the output. Takes about two and a
# half minutes, most of it the build.
#
# Usage (repo root): OUT=/some/dir bash bench/gpu_capture.sh
# (STEPS="test bench" to run only some of: test bench alloc memcheck;
# memcheck, compute-sanitizer on test_capture, is off unless named.)
set -u
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-/tmp/tidepool-capture-build}
STEPS=${STEPS:-test bench alloc}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_capture.log") 2>&1

echo "== $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true

# The test programs link the trace replay, which needs zlib's headers; a
# machine without them gets them from .device/zlib, as bench/gpu_run.sh.
zopts=()
if [[ ! -e /usr/include/zlib.h && -e .device/zlib/zlib.h ]]; then
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  zopts=(-DZLIB_INCLUDE_DIR="$PWD/.device/zlib" -DZLIB_LIBRARY="$zlib")
fi
t0=$SECONDS
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON \
  "${zopts[@]}" >"$OUT/build.txt" 2>&1 ||
  ! cmake --build "$BUILD" -j"$(nproc)" --target test_capture graph_bench \
    bench_alloc >>"$OUT/build.txt" 2>&1; then
  tail -40 "$OUT/build.txt"
  echo "SUMMARY: build FAILED"
  exit 1
fi
echo "== built in $((SECONDS - t0)) s"

declare -a summary
run() {
  local name=$1 limit=$2
  shift 2
  if [[ " $STEPS " != *" $name "* ]]; then
    return
  fi
  echo
  echo "== $name: $*"
  local t=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  cat "$OUT/$name.txt"
  echo "== $name: exit $rc after $((SECONDS - t)) s"
  if [[ $rc == 0 ]]; then
    summary+=("$name: ok ($((SECONDS - t)) s)")
  else
    summary+=("$name: FAILED, exit $rc (log $OUT/$name.txt)")
  fi
}

export TIDEPOOL_PLATFORM=cuda
run test 120 "$BUILD/test_capture"
run bench 120 "$BUILD/graph_bench" --launches 10000
run alloc 120 "$BUILD/bench_alloc" --quick --no-cudamalloc \
  --json "$OUT/bench_alloc_quick.json"
if command -v compute-sanitizer >/dev/null; then
  run memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/test_capture"
fi

echo
echo "SUMMARY"
for line in "${summary[@]}"; do
  echo "  $line"
done
if [[ -e $OUT/test.txt ]]; then
  grep -E "FAIL|checks? (passed|FAILED)" "$OUT/test.txt" | head -20 |
    sed 's/^/  test_capture: /'
fi
if [[ -e $OUT/bench.txt ]]; then
  grep -E "^(graph |tidepool |in-driver |plain |\+empty |\+userobj |\+both |driver |per graph against|graph memory|freeing)" "$OUT/bench.txt" |
    sed 's/^/  graph_bench: /'
fi
