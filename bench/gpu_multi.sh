#!/usr/bin/env bash
# Two-GPU checks of tidepool (issue 11), for a machine with two GPUs of one
# host: builds, then on the cuda platform runs the whole test suite with
# both devices visible and again with only the second (CUDA_VISIBLE_DEVICES=1,
# so that it is numbered 0), the cross-device IPC tests (an importer whose
# current device is 1; one that sees only the other GPU), compute-sanitizer
# memcheck over the two-device tests, and peer_copy (tidepool's pools
# against the driver's, side by side). Prints a summary; every log is under
# $OUT. About 3 to 4 minutes; each step has a time limit, and the whole
# stays under 6 minutes even when one hangs.
#
# Usage (repo root): OUT=/some/dir bash bench/gpu_multi.sh
# (STEPS="ipc_cross peer_copy" runs only some steps; BUILD=dir reuses a
# build.) Where the machine has no zlib headers, zlib.h and zconf.h in
# .device/zlib are used, as bench/gpu_run.sh does.
set -u
OUT=${OUT:-$PWD/gpu-multi-out}
BUILD=${BUILD:-/tmp/tidepool-gpu-multi}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_multi.log") 2>&1
START=$SECONDS

echo "== $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv ||
  true
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ ${gpus:-0} -lt 2 ]]; then
  echo "blocked: $gpus GPU(s) here; these checks need 2"
  exit 2
fi

zopts=()
if [[ ! -e /usr/include/zlib.h && -e .device/zlib/zlib.h ]]; then
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  zopts=(-DZLIB_INCLUDE_DIR="$PWD/.device/zlib" -DZLIB_LIBRARY="$zlib")
fi
echo "== build ($BUILD)"
if ! timeout 240 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DTP_WERROR=ON "${zopts[@]}" >"$OUT/build.log" 2>&1 ||
  ! timeout 240 cmake --build "$BUILD" -j"$(nproc)" >>"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "build FAILED"
  exit 1
fi
echo "built in $((SECONDS - START)) s"

names=()
verdicts=()
times=()
# step NAME LIMIT CMD...: runs CMD with a time limit, its output in
# $OUT/NAME.log, and records pass (exit 0), skip (exit 77) or FAIL.
step() {
  local name=$1 limit=$2
  shift 2
  if [[ -n ${STEPS:-} && " $STEPS " != *" $name "* ]]; then
    return
  fi
  echo
  echo "== $name: $*"
  local t0=$SECONDS rc
  (cd "$BUILD" && timeout "$limit" "$@") >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 25 "$OUT/$name.log"
  local verdict=pass
  if [[ $rc -eq 77 ]]; then
    verdict=skip
  elif [[ $rc -eq 124 ]]; then
    verdict="FAIL (over ${limit} s)"
  elif [[ $rc -ne 0 ]]; then
    verdict="FAIL (exit $rc)"
  fi
  echo "== $name: $verdict after $((SECONDS - t0)) s"
  names+=("$name")
  verdicts+=("$verdict")
  times+=("$((SECONDS - t0))")
}

export TIDEPOOL_PLATFORM=cuda
unset CUDA_VISIBLE_DEVICES
ctest_args=(ctest --output-on-failure --no-tests=error --timeout 100)
# The whole suite with both GPUs: test_multidevice and test_ipc's
# cross-device tests run here too.
step ctest_both 150 "${ctest_args[@]}"
# Only the second GPU, numbered 0: the suite must not care which GPU it is.
step ctest_gpu1 150 env CUDA_VISIBLE_DEVICES=1 "${ctest_args[@]}"
# The cross-device IPC tests by themselves, verbose.
step ipc_cross 60 env \
  TP_TEST_ONLY=test_importer_on_device1,test_invisible_device,test_same_process \
  ./test_ipc
if command -v compute-sanitizer >/dev/null; then
  san=(compute-sanitizer --tool memcheck --error-exitcode 9
    --target-processes all)
  step memcheck_multidevice 90 "${san[@]}" ./test_multidevice
  step memcheck_ipc_cross 90 env \
    TP_TEST_ONLY=test_importer_on_device1,test_invisible_device \
    "${san[@]}" ./test_ipc
else
  echo "compute-sanitizer not found: memcheck steps left out"
fi
step peer_copy 90 ./peer_copy

echo
echo "======================================================================"
echo "summary ($((SECONDS - START)) s in all; logs in $OUT)"
failed=0
for i in "${!names[@]}"; do
  printf '  %-22s %-22s %4s s\n' "${names[$i]}" "${verdicts[$i]}" \
    "${times[$i]}"
  [[ ${verdicts[$i]} == FAIL* ]] && failed=$((failed + 1))
done
for f in ctest_both ctest_gpu1; do
  [[ -f $OUT/$f.log ]] && echo "  $f: $(grep -E 'tests passed' "$OUT/$f.log")"
done
if [[ -f $OUT/peer_copy.log ]]; then
  echo "  peer_copy:"
  grep -E '^ *(size|[0-9]+ MiB)|lowest ratio' "$OUT/peer_copy.log" |
    sed 's/^/    /'
fi
if [[ -f $OUT/ipc_cross.log ]]; then
  grep -E 'importer with|FAIL' "$OUT/ipc_cross.log" | sed 's/^/  ipc: /'
fi
echo "$failed step(s) failed"
exit $((failed > 0))
