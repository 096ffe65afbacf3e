#!/usr/bin/env bash
# The zero-code path on a GPU machine: builds the preload interposer, runs
# the runtime-names test (test_preload_cuda) under it, directly and through
# tidepool-run; the driver-names test (test_preload_driver, which reaches the
# driver as a statically linked runtime does); a program built by nvcc with
# its default static runtime (test/test_preload_static.cu); then
# bench/gpu_preload.py: PyTorch training with backend:cudaMallocAsync on the
# driver's pool and under tidepool-run, PyTorch out of memory, CuPy's
# MemoryAsyncPool (CuPy links the runtime statically), and a small model's
# forward and backward captured in torch.cuda.graph and replayed 100 times,
# each replay checked against eager mode, on the driver's graph memory and
# under tidepool-run (tidepool's capture path). Each test also runs with
# TIDEPOOL_PRELOAD=0 (the driver answers). Logs in $OUT; a summary at the
# end. About 4 minutes on one H200.
#
# Usage (repo root): OUT=/some/dir bash bench/gpu_preload.sh [--steps N]
set -u
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-/tmp/tidepool-preload-build}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_preload.log") 2>&1
echo "== $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" ||
  true
python3 -c "import cupy; print('cupy', cupy.__version__)" || true

zopts=()
if [[ ! -e /usr/include/zlib.h && -e .device/zlib/zlib.h ]]; then
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  zopts=(-DZLIB_INCLUDE_DIR="$PWD/.device/zlib" -DZLIB_LIBRARY="$zlib")
fi
echo "== build"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON "${zopts[@]}" \
  >"$OUT/preload_build.txt" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target tidepool_preload \
    test_preload_cuda test_preload test_preload_driver \
    >>"$OUT/preload_build.txt" 2>&1 ||
  {
    tail -30 "$OUT/preload_build.txt"
    exit 1
  }
lib=$BUILD/libtidepool_preload.so
run=$BUILD/tidepool-run
test_cuda=$BUILD/src/preload/test_preload_cuda
test_driver=$BUILD/src/preload/test_preload_driver
[[ -x $test_cuda && -x $test_driver && -f $lib && -x $run ]] || {
  echo "the build made no interposer (no CUDA 13 headers?)"
  exit 1
}

declare -A verdict
echo "== test_preload_cuda under LD_PRELOAD"
TIDEPOOL_PRELOAD_REPORT=1 LD_PRELOAD=$lib timeout 180 "$test_cuda" cuda \
  >"$OUT/test_preload_cuda.txt" 2>&1
rc=$?
grep -E "FAIL|ok$|checks|interposer|tidepool-preload" "$OUT/test_preload_cuda.txt"
verdict[conformance]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")

echo "== test_preload_cuda through tidepool-run"
TIDEPOOL_PRELOAD_REPORT=1 timeout 180 "$run" "$test_cuda" cuda \
  >"$OUT/test_preload_cuda_run.txt" 2>&1
rc=$?
tail -2 "$OUT/test_preload_cuda_run.txt"
verdict[launcher]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")

echo "== test_preload_cuda with TIDEPOOL_PRELOAD=0 (the driver answers)"
TIDEPOOL_PRELOAD=0 LD_PRELOAD=$lib timeout 120 "$test_cuda" off \
  >"$OUT/test_preload_cuda_off.txt" 2>&1
rc=$?
tail -1 "$OUT/test_preload_cuda_off.txt"
verdict[off]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")

echo "== test_preload_driver: the driver's names, reached as a static runtime does"
TIDEPOOL_PRELOAD_REPORT=1 LD_PRELOAD=$lib timeout 180 "$test_driver" cuda \
  >"$OUT/test_preload_driver.txt" 2>&1
rc=$?
grep -E "FAIL|ok$|checks|interposer|tidepool-preload" "$OUT/test_preload_driver.txt"
verdict[driver]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")
TIDEPOOL_PRELOAD=0 LD_PRELOAD=$lib timeout 120 "$test_driver" off \
  >"$OUT/test_preload_driver_off.txt" 2>&1
rc=$?
tail -1 "$OUT/test_preload_driver_off.txt"
verdict[driver_off]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")

echo "== test_preload_static: nvcc's default -cudart static"
static=$BUILD/test_preload_static
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if "$NVCC" -o "$static" test/test_preload_static.cu >"$OUT/static_build.txt" 2>&1; then
  if readelf -d "$static" | grep -q 'libcudart'; then
    verdict[static]="FAILED (the program links a shared libcudart)"
  else
    TIDEPOOL_PRELOAD_REPORT=1 LD_PRELOAD=$lib timeout 120 "$static" cuda \
      >"$OUT/test_preload_static.txt" 2>&1
    rc=$?
    cat "$OUT/test_preload_static.txt"
    verdict[static]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")
    TIDEPOOL_PRELOAD=0 LD_PRELOAD=$lib timeout 120 "$static" off \
      >"$OUT/test_preload_static_off.txt" 2>&1
    rc=$?
    tail -1 "$OUT/test_preload_static_off.txt"
    verdict[static_off]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")
  fi
else
  tail -20 "$OUT/static_build.txt"
  verdict[static]="FAILED (nvcc)"
fi

echo "== PyTorch and CuPy (bench/gpu_preload.py)"
timeout 900 python3 bench/gpu_preload.py --run "$run" --out "$OUT" \
  --json "$OUT/gpu_preload.json" "$@"
rc=$?
verdict[frameworks]=$([[ $rc -eq 0 ]] && echo "passed" || echo "FAILED (exit $rc)")

echo
echo "== summary"
printf '%-44s %s\n' "runtime-names test under LD_PRELOAD" "${verdict[conformance]}"
printf '%-44s %s\n' "runtime-names test through tidepool-run" "${verdict[launcher]}"
printf '%-44s %s\n' "TIDEPOOL_PRELOAD=0" "${verdict[off]}"
printf '%-44s %s\n' "driver-names test (static runtime's path)" "${verdict[driver]}"
printf '%-44s %s\n' "driver-names test, TIDEPOOL_PRELOAD=0" "${verdict[driver_off]}"
printf '%-44s %s\n' "nvcc -cudart static program" "${verdict[static]}"
printf '%-44s %s\n' "nvcc -cudart static, TIDEPOOL_PRELOAD=0" "${verdict[static_off]:-not run}"
printf '%-44s %s\n' "PyTorch, OOM, CuPy, graphs (table above)" "${verdict[frameworks]}"
echo "logs: $OUT"
for v in "${verdict[@]}"; do
  [[ $v == passed ]] || exit 1
done
