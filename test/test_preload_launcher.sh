#!/bin/sh
# test_preload_launcher: tidepool-run puts the interposer first in
# LD_PRELOAD, sets PyTorch's allocator backend only where the user did not,
# refuses to run nothing, and the command it runs gets tidepool's answers
# (the preload test program, on the host platform). The commands run are the
# test program itself (its "env" mode prints the two variables and exits
# with 3): in a sanitizer build the interposer needs the sanitizer's runtime,
# which only the instrumented program carries.
# Usage: test_preload_launcher.sh TIDEPOOL_RUN LIB TEST_PRELOAD
set -u
run=$1 lib=$2 test_program=$3
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
expect() { # what got want
  if [ "$2" != "$3" ]; then fail "$1: got '$2', expected '$3'"; fi
}
libdir=$(cd "$(dirname "$lib")" && pwd)
lib_abs=$libdir/$(basename "$lib")

out=$(env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF \
  TIDEPOOL_PRELOAD=0 "$run" "$test_program" env)
expect "plain" "$out" "$lib_abs|backend:cudaMallocAsync"

out=$(env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF \
  LD_PRELOAD=/nonexistent/other.so TIDEPOOL_PRELOAD=0 \
  "$run" "$test_program" env 2>/dev/null)
expect "prepended" "$out" "$lib_abs:/nonexistent/other.so|backend:cudaMallocAsync"

out=$(env -u LD_PRELOAD -u PYTORCH_ALLOC_CONF \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True TIDEPOOL_PRELOAD=0 \
  "$run" "$test_program" env 2>"${TMPDIR:-/tmp}/tp-run-err.$$")
expect "user's configuration kept" "$out" "$lib_abs|expandable_segments:True"
if ! grep -q "without backend:cudaMallocAsync" "${TMPDIR:-/tmp}/tp-run-err.$$"
then
  fail "no note that PyTorch's allocator stays in use"
fi
rm -f "${TMPDIR:-/tmp}/tp-run-err.$$"

# Both set, the backend named in one only: PyTorch versions differ in which
# they read first, so the other is noted (the two were once read as one).
env -u LD_PRELOAD PYTORCH_ALLOC_CONF=expandable_segments:True \
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync TIDEPOOL_PRELOAD=0 \
  "$run" true 2>"${TMPDIR:-/tmp}/tp-run-err.$$"
if ! grep -q "PYTORCH_ALLOC_CONF is set without backend:cudaMallocAsync" \
  "${TMPDIR:-/tmp}/tp-run-err.$$"; then
  fail "no note that PYTORCH_ALLOC_CONF lacks the backend"
fi
rm -f "${TMPDIR:-/tmp}/tp-run-err.$$"

out=$(env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF=x \
  TIDEPOOL_PRELOAD=0 "$run" "$test_program" env 2>/dev/null)
expect "PYTORCH_ALLOC_CONF respected" "$out" "$lib_abs|unset"

# A name without a slash, found in the current directory, reaches
# LD_PRELOAD as an absolute path: the loader would search its library path
# for the bare name and run the command without the interposer.
out=$(cd "$libdir" && env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF \
  -u PYTORCH_ALLOC_CONF TIDEPOOL_PRELOAD=0 \
  TIDEPOOL_PRELOAD_LIB=$(basename "$lib") "$run" "$test_program" env)
expect "relative library made absolute" "$out" "$lib_abs|backend:cudaMallocAsync"

env -u LD_PRELOAD TIDEPOOL_PRELOAD_LIB=/elsewhere/x.so "$run" true 2>/dev/null
expect "missing library refused" "$?" "2"

"$run" >/dev/null 2>&1
expect "no command" "$?" "2"
"$run" --help >/dev/null 2>&1
expect "--help" "$?" "0"
"$run" -- "$test_program" env >/dev/null
expect "the command's exit status" "$?" "3"

# End to end: the preload test program under the launcher.
if ! env -u LD_PRELOAD TIDEPOOL_PRELOAD=host "$run" "$test_program" host \
  >"${TMPDIR:-/tmp}/tp-run-test.$$" 2>&1; then
  cat "${TMPDIR:-/tmp}/tp-run-test.$$"
  fail "test_preload under tidepool-run"
fi
rm -f "${TMPDIR:-/tmp}/tp-run-test.$$"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) FAILED"
  exit 1
fi
echo "all checks passed"
