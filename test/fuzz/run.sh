#!/usr/bin/env bash
# Runs the API fuzzer (fuzz_api, libFuzzer) for a given time and prints what
# the run did: executions, executions per second, coverage (libFuzzer's cov:
# and ft: at the end) and findings. Exits 1 when there is a finding, so CI
# can use it as is.
#
#   test/fuzz/run.sh [--seconds N] [--seed S] [--build DIR] [--out DIR]
#                    [--keep-going] [-- LIBFUZZER_FLAGS...]
#
# --build: a build directory configured with TP_FUZZ=ON (and usually
#   TP_SANITIZE=address,undefined); without it one is configured and built
#   under --out with clang.
# --out: where the run's corpus, log and any finding's input go (default: a
#   new directory under ${TMPDIR:-/tmp}); the corpus in the repository is
#   read, never written.
# --keep-going: run on after a finding (libFuzzer's -fork=1 with
#   -ignore_crashes), to collect several in a long run; by default the
#   first finding ends the run.
# TP_FUZZ_SKIP (see fuzz_api.c) passes through, as do ASAN_OPTIONS and
# UBSAN_OPTIONS. Run it with nice on a shared machine.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SECONDS_TO_RUN=60
SEED=1
BUILD=""
OUT=""
KEEP_GOING=0
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
  --seconds) SECONDS_TO_RUN=$2; shift 2 ;;
  --seed) SEED=$2; shift 2 ;;
  --build) BUILD=$2; shift 2 ;;
  --out) OUT=$2; shift 2 ;;
  --keep-going) KEEP_GOING=1; shift ;;
  --) shift; EXTRA=("$@"); break ;;
  -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
  *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

if [[ -z "$OUT" ]]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/tidepool-fuzz.XXXXXX")
fi
mkdir -p "$OUT/corpus" "$OUT/findings"

if [[ -z "$BUILD" ]]; then
  BUILD="$OUT/build"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER=clang \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTP_DEBUG_CHECKS=ON \
    -DTP_SANITIZE=address,undefined -DTP_FUZZ=ON >"$OUT/configure.log"
  cmake --build "$BUILD" -j "${JOBS:-2}" --target fuzz_api >"$OUT/build.log"
fi
FUZZER="$BUILD/fuzz_api"
[[ -x "$FUZZER" ]] || {
  echo "run.sh: $FUZZER not found (configure with -DTP_FUZZ=ON)" >&2
  exit 2
}

# libFuzzer's leak check needs LeakSanitizer; follow ASAN_OPTIONS.
LEAKS=1
if [[ "${ASAN_OPTIONS:-}" == *detect_leaks=0* ]]; then LEAKS=0; fi

FLAGS=(-seed="$SEED" -max_total_time="$SECONDS_TO_RUN" -max_len=2048
  -len_control=20 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1
  -detect_leaks="$LEAKS" -artifact_prefix="$OUT/findings/")
if [[ $KEEP_GOING -eq 1 ]]; then
  FLAGS+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
fi
echo "fuzzing for $SECONDS_TO_RUN s with seed $SEED" \
  "(TP_FUZZ_SKIP=${TP_FUZZ_SKIP:-}); log in $OUT/fuzz.log"
rc=0
"$FUZZER" "${FLAGS[@]}" "${EXTRA[@]}" "$OUT/corpus" "$HERE/corpus" \
  >"$OUT/fuzz.log" 2>&1 || rc=$?

# Figures from libFuzzer's output: the final stats when it printed them,
# else its last status line.
stat() { grep -E "^stat::$1:" "$OUT/fuzz.log" | tail -n1 | awk '{print $2}'; }
last=$(grep -E "cov: [0-9]+ ft: [0-9]+" "$OUT/fuzz.log" | tail -n1 || true)
execs=$(stat number_of_executed_units)
rate=$(stat average_exec_per_sec)
if [[ -z "$execs" ]]; then
  execs=$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$last")
  rate=$(sed -nE 's/.*exec\/s: ([0-9]+).*/\1/p' <<<"$last")
fi
cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$last")
corp=$(sed -nE 's/.*corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$last")
mapfile -t found < <(find "$OUT/findings" -type f | sort)

echo
echo "== fuzz_api: $SECONDS_TO_RUN s, seed $SEED"
echo "executions:   ${execs:-?} (${rate:-?} per second)"
echo "coverage:     cov ${cov:-?}, ft ${ft:-?} (corpus ${corp:-?})"
echo "findings:     ${#found[@]}"
for f in "${found[@]}"; do
  echo "  $f"
done
if [[ ${#found[@]} -gt 0 ]]; then
  echo
  echo "-- what the first finding said --"
  grep -E "FUZZ FINDING|ERROR: AddressSanitizer|runtime error|ERROR: libFuzzer|SUMMARY" \
    "$OUT/fuzz.log" | head -n 10 || true
  echo "replay one with: $BUILD/fuzz_api FILE (TP_FUZZ_TRACE=1 prints each call)"
  exit 1
fi
if [[ $rc -ne 0 ]]; then
  echo "run.sh: the fuzzer exited with status $rc without a finding;" \
    "see $OUT/fuzz.log" >&2
  tail -n 20 "$OUT/fuzz.log" >&2
  exit 1
fi
exit 0
