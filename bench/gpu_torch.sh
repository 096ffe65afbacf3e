#!/usr/bin/env bash
# The PyTorch half of the GPU runs: builds the shared library, then runs the
# integration's smoke test and the four-allocator training benchmark. Output
# to $OUT/gpu_torch.log and $OUT/torch_train.json.
#
# Usage (repo root): OUT=/some/dir bash bench/gpu_torch.sh [benchmark args]
set -u
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-/tmp/tidepool-torch-build}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_torch.log") 2>&1
echo "== $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
zopts=()
if [[ ! -e /usr/include/zlib.h && -e .device/zlib/zlib.h ]]; then
  zlib=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
  zopts=(-DZLIB_INCLUDE_DIR="$PWD/.device/zlib" -DZLIB_LIBRARY="$zlib")
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON "${zopts[@]}" \
  >"$OUT/torch_build.txt" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target tidepool >>"$OUT/torch_build.txt" 2>&1 ||
  { tail -30 "$OUT/torch_build.txt"; exit 1; }
export TIDEPOOL_LIB=$BUILD/libtidepool.so
echo "== smoke test"
timeout 300 python3 integrations/pytorch/test_smoke.py
echo "== smoke test: exit $?"
echo "== training benchmark"
timeout 500 python3 bench/torch_train_bench.py --json "$OUT/torch_train.json" "$@"
echo "== training benchmark: exit $?"
