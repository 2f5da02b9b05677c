#!/usr/bin/env bash
# Builds the `fuzz` preset (clang-14, libFuzzer, ASan + UBSan on the whole library) and fuzzes
# KvCache's API (tests/fuzz/kv_cache_fuzz.cc) for a while, starting from the seed corpus.
#
#   scripts/fuzz.sh [SECONDS] [libFuzzer flags...]     default 60 s; e.g. scripts/fuzz.sh 600 -jobs=2
#
# The grown corpus goes to a temporary directory (removed afterwards) unless KVTIER_FUZZ_CORPUS
# names a directory to keep it in; the seeds in tests/fuzz/corpus/ are never modified. An input
# that fails is saved under build/fuzz/artifacts/ and the script exits non-zero. Replay one with
# every call printed:
#   KVTIER_FUZZ_VERBOSE=1 build/fuzz/tests/fuzz/kvtier_kv_cache_fuzz build/fuzz/artifacts/crash-...
# Regenerate the seeds with: python3 tests/fuzz/make_corpus.py
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
if [ $# -gt 0 ]; then shift; fi
case "$seconds" in
  '' | *[!0-9]*)
    echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2
    exit 2
    ;;
esac

start=$SECONDS
cmake --preset fuzz
cmake --build --preset fuzz
echo "fuzz.sh: configure and build took $((SECONDS - start)) s"

fuzzer=build/fuzz/tests/fuzz/kvtier_kv_cache_fuzz
artifacts=build/fuzz/artifacts
mkdir -p "$artifacts"
if [ -n "${KVTIER_FUZZ_CORPUS:-}" ]; then
  corpus=$KVTIER_FUZZ_CORPUS
  mkdir -p "$corpus"
else
  corpus=$(mktemp -d /tmp/kvtier_fuzz_corpus_XXXXXX)
  trap 'rm -rf "$corpus"' EXIT
fi
cp tests/fuzz/corpus/* "$corpus"/

start=$SECONDS
status=0
# -timeout: one input running 10 s is a hang. -rss_limit_mb: the default 2048 is tight under ASan
# with the cache's worker threads.
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$@" "$corpus" || status=$?
echo "fuzz.sh: fuzzing took $((SECONDS - start)) s (exit status $status)"
if [ "$status" -ne 0 ]; then
  echo "fuzz.sh: the fuzzer found a failing input (saved in $artifacts/):" >&2
  ls -l "$artifacts" >&2 || true
  echo "fuzz.sh: replay: KVTIER_FUZZ_VERBOSE=1 $fuzzer $artifacts/<file>" >&2
fi
exit "$status"
