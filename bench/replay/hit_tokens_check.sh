#!/usr/bin/env bash
# Prints the replay's hit_tokens at every configuration docs/performance.md records, one line per
# run ("<config> <run> <capacity blocks> <hit_tokens>"), for a before/after diff of a change that
# must not change behaviour (issue 12):
#   bench/replay/hit_tokens_check.sh build/default > before.txt   # ... change, rebuild ...
#   bench/replay/hit_tokens_check.sh build/default > after.txt && diff before.txt after.txt
# Needs ../shared/traces (skips the trace configurations, with a note on stderr, without them).
# About 3-5 minutes on 2 cores (payload none throughout).
set -euo pipefail
build=${1:-build/default}
replay="$build/bench/replay/kvtier-replay"
shared=${KVTIER_SHARED:-../shared}
M="$shared/traces/mooncake/conversation_trace.jsonl"
C="$shared/traces/kv-cache-tester-claude-code"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # name, flags...
  local name=$1
  shift
  "$replay" --mode cache --payload none --quiet --json "$out/$name.json" "$@" > /dev/null
  python3 - "$name" "$out/$name.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
runs = doc["runs"] if isinstance(doc, dict) and "runs" in doc else [doc]
for r in runs:
    print(name, r.get("name"), r.get("capacity_blocks"), r.get("hit_tokens"))
PY
}

run agentic_none
run agentic_none_compare --compare
if [[ -f "$M" ]]; then
  run mc_default "--trace=$M" --compare
  run mc_1t "--trace=$M" --prefill-instances 4 --hbm 1TiB --dram 2TiB --nvme 4TiB --remote-size 0 --compare
  run mc_sweep "--trace=$M" --prefill-instances 4 --dram 0 --nvme 0 --remote-size 0 --compare \
    --sweep hbm=1000blocks,2000blocks,3000blocks,5000blocks,7500blocks,10000blocks
else
  echo "hit_tokens_check: $M absent: Mooncake configurations skipped" >&2
fi
if [[ -d "$C" ]]; then
  run cc_default "--trace=$C"
  for h in none pause stop-reason; do
    run "cc_hbm_$h" "--trace=$C" --prefill-instances 4 --hbm 256GiB --dram 0 --nvme 0 --remote-size 0 \
      --hints "$h" --compare
  done
  for h in none pause; do
    run "cc_tiers_$h" "--trace=$C" --prefill-instances 4 --hbm 256GiB --dram 2TiB --nvme 4TiB \
      --remote-size 0 --hints "$h" --compare
  done
else
  echo "hit_tokens_check: $C absent: Claude Code configurations skipped" >&2
fi
