#!/usr/bin/env bash
# Builds tidepool on a GPU machine and runs, on the cuda platform, the
# conformance suite, the GPU-only platform tests, the stress test (also under
# compute-sanitizer), the allocation benchmark side by side with the driver,
# and the trace replay; then the host-platform benchmark on that machine's
# cores. Everything goes to one log, $OUT/gpu_run.log, plus JSON files.
#
# Usage (repo root): OUT=/some/dir bash bench/gpu_run.sh
# (STEPS="ipc replay_cuda" to run only some steps.)
# Expects the traces in .device/traces (or TRACES=dir) and, where the machine
# has no zlib headers, zlib.h and zconf.h in .device/zlib.
set -u
OUT=${OUT:-$PWD/gpu-out}
TRACES=${TRACES:-$PWD/.device/traces}
BUILD=${BUILD:-/tmp/tidepool-gpu-build}
mkdir -p "$OUT"
LOG=$OUT/gpu_run.log
exec > >(tee "$LOG") 2>&1

echo "== $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
nproc

zopts=()
if [[ ! -e /usr/include/zlib.h && -e .device/zlib/zlib.h ]]; then
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  zopts=(-DZLIB_INCLUDE_DIR="$PWD/.device/zlib" -DZLIB_LIBRARY="$zlib")
fi
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON \
  "${zopts[@]}" >"$OUT/build.txt" 2>&1 ||
  ! cmake --build "$BUILD" -j"$(nproc)" >>"$OUT/build.txt" 2>&1; then
  tail -40 "$OUT/build.txt"
  exit 1
fi
cd "$BUILD" || exit 1

# STEPS="a b ..." runs only the named steps (the names below).
step() {
  local name=$1 limit=$2
  shift 2
  if [[ -n ${STEPS:-} && " $STEPS " != *" $name "* ]]; then
    return
  fi
  echo
  echo "== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@"
  echo "== $name: exit $? after $((SECONDS - t0)) s"
}

export TIDEPOOL_PLATFORM=cuda
step cuda_platform 120 ./test_cuda_platform
step conformance 300 ctest -R '^conformance_' --output-on-failure --no-tests=error
step stress 300 ./test_stress
if command -v compute-sanitizer >/dev/null; then
  step stress_memcheck 400 env TP_STRESS_THREADS=2 TP_STRESS_OPS=400 \
    compute-sanitizer --tool memcheck --error-exitcode 9 ./test_stress
fi
step ipc 180 ./test_ipc
step ipc_example 60 ./example_ipc_producer_consumer
step vmm_cost 300 ./vmm_cost
step cu_call_cost 120 ./cu_call_cost
step multidevice 120 ./test_multidevice
step peer_copy 200 ./peer_copy
step bench_cuda 400 ./bench_alloc --json "$OUT/bench_cuda.json"
step replay_cuda 300 ./tidepool-replay --no-progress --against driver "$TRACES"/*.csv.gz
step replay_cuda_json 300 ./tidepool-replay --no-progress --json --against driver "$TRACES"/*.csv.gz
export TIDEPOOL_PLATFORM=host
step bench_host 300 ./bench_alloc --json "$OUT/bench_host.json"
step replay_host 300 ./tidepool-replay --no-progress "$TRACES"/*.csv.gz
