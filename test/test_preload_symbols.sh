#!/bin/sh
# test_preload_symbols: the interposer exports exactly the runtime's names
# it intercepts, each with the runtime's version node, its diagnostics under
# their own node, and dlsym/dlvsym at the C library's versions (DL_HOOKS,
# NAME@VERSION lines); nothing of tidepool's is visible, it does not load
# the runtime or the driver itself, and its own way to the C library's
# dlvsym is a version it does not define. Where the toolkit's runtime is
# given, each intercepted name must exist there with the same node.
# Usage: test_preload_symbols.sh LIB EXPORTS DIAGNOSTICS NODE DL_HOOKS [CUDART]
set -u
lib=$1 exports=$2 diagnostics=$3 node=$4 dl_hooks=$5 cudart=${6:-}
diag_node=TIDEPOOL_PRELOAD_0

if ! command -v readelf >/dev/null 2>&1; then
  echo "SKIP: readelf is not installed"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tp-symbols.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# Defined dynamic symbols as NAME@VERSION, one per line. The definitions of
# the version nodes themselves (absolute symbols named after the node, with
# no version of their own) are left out.
defined() {
  readelf --dyn-syms -W "$1" |
    awk '$7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") && $6 == "DEFAULT" {
      if ($7 == "ABS" && $8 !~ /@/) next
      name = $8; sub(/@@/, "@", name); print name }' |
    sort -u
}

defined "$lib" >"$work/have"
{
  sed "s/\$/@$node/" "$exports"
  sed "s/\$/@$diag_node/" "$diagnostics"
  cat "$dl_hooks"
} | sort -u >"$work/want"

comm -13 "$work/have" "$work/want" >"$work/missing"
comm -23 "$work/have" "$work/want" >"$work/extra"
while read -r s; do fail "not exported: $s"; done <"$work/missing"
while read -r s; do fail "exported but not intended: $s"; done <"$work/extra"

# Every intercepted name is a function with default visibility.
readelf --dyn-syms -W "$lib" |
  awk '$7 != "UND" && $8 ~ /^cuda/ && $4 != "FUNC" { print $8 }' >"$work/odd"
while read -r s; do fail "not a function: $s"; done <"$work/odd"

# The C library's dlvsym the interposer calls must be one it does not
# define itself, or its lookups would come back to it.
readelf --dyn-syms -W "$lib" |
  awk '$7 == "UND" && $8 ~ /^dlvsym@/ { sub(/ .*/, "", $8); print $8 }' \
    >"$work/real_dlvsym"
if [ "$(wc -l <"$work/real_dlvsym")" -ne 1 ]; then
  fail "not exactly one reference to the C library's dlvsym"
fi
while read -r s; do
  if grep -qx "$s" "$work/have"; then
    fail "the C library's $s is also defined by the interposer"
  fi
done <"$work/real_dlvsym"

# The interposer finds the runtime at run time; it must not pull in one.
readelf -d "$lib" | grep NEEDED | grep -E 'libcuda(rt)?\.so' >"$work/needed"
while read -r s; do fail "depends on the CUDA libraries: $s"; done \
  <"$work/needed"

if [ -n "$cudart" ] && [ -f "$cudart" ]; then
  defined "$cudart" >"$work/runtime"
  sed "s/\$/@$node/" "$exports" | sort -u >"$work/intercepted"
  comm -23 "$work/intercepted" "$work/runtime" >"$work/unknown"
  while read -r s; do fail "the runtime has no $s"; done <"$work/unknown"
  echo "checked against $cudart"
fi

count=$(wc -l <"$work/want")
if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) FAILED"
  exit 1
fi
echo "all checks passed: $count symbols, node $node"
