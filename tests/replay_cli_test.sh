#!/usr/bin/env bash
# kvtier-replay's command line: the default run prints a report; malformed input exits 2 with a
# message naming the file, line and field, and writes no JSON.
set -uo pipefail
bin_path="$1"
# The cache replay (--mode cache): this script checks its reports and input errors.
bin() { "$bin_path" --mode cache "$@"; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$(bin --quiet --max-requests 150 --payload scaled --json "$dir/r.json") || fail "default run: rc $?"
grep -q "^lru " <<<"$out" || fail "no report row: $out"
grep -q '"corrupt_blocks": 0' "$dir/r.json" || fail "corrupt blocks or no JSON"

# Line 2 has a negative length.
printf '%s\n' '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}' \
  '{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": [1]}' > "$dir/bad.jsonl"
err=$(bin --quiet --trace "$dir/bad.jsonl" --json "$dir/bad.json" 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "malformed trace: rc $rc, want 2: $err"
grep -q "bad.jsonl" <<<"$err" && grep -q ":2" <<<"$err" && grep -q "input_length" <<<"$err" ||
  fail "message does not name file, line and field: $err"
[ ! -e "$dir/bad.json" ] || fail "JSON written for a failed run"

# Not JSON at all; a bad flag; an unknown model.
echo 'not json' > "$dir/junk.jsonl"
bin --quiet --trace "$dir/junk.jsonl" >/dev/null 2>&1; [ $? -eq 2 ] || fail "junk: rc != 2"
bin --quiet --hbm 12XB >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad size: rc != 2"
bin --quiet --model GPT-9 >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad model: rc != 2"
bin --quiet --no-such-flag >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad flag: rc != 2"
bin --quiet --sweep hbm= >/dev/null 2>&1; [ $? -eq 2 ] || fail "empty sweep: rc != 2"
bin --quiet --tokens-per-block -4 >/dev/null 2>&1; [ $? -eq 2 ] || fail "negative block: rc != 2"

# A model from --geometry-csv: its geometry, and the cost model once --active-params is given.
printf '%s\n' 'model,attention,layers_growing_with_context,num_key_value_heads,head_dim,kv_lora_rank,qk_rope_head_dim,hidden_size' \
  'Tiny-1B,GQA,4,2,64,,,1024' > "$dir/models.csv"
bin --quiet --max-requests 20 --geometry-csv "$dir/models.csv" --model Tiny-1B >/dev/null 2>&1
[ $? -eq 2 ] || fail "unknown active params: rc != 2"
out=$(bin --quiet --max-requests 20 --geometry-csv "$dir/models.csv" --model Tiny-1B \
  --active-params 1e9) || fail "csv model with --active-params: rc $?"
grep -q "model Tiny-1B (128.0 KiB per 64-token block)" <<<"$out" || fail "csv geometry not used: $out"
# Files that would not fit the disk are refused before anything is written.
mkdir -p "$dir/scratch"
err=$(bin --quiet --payload scaled --nvme 1000TiB --nvme-path "$dir/scratch" 2>&1); rc=$?
[ "$rc" -eq 2 ] || fail "an NVMe file larger than the disk: rc $rc, want 2: $err"
grep -q "would not fit" <<<"$err" || fail "no disk-space message: $err"
[ -z "$(ls -A "$dir/scratch")" ] || fail "files left after the refusal: $(ls "$dir/scratch")"

# SIGTERM mid-run removes the scratch directory (the NVMe file and the directory store).
"$bin_path" --mode cache --quiet --payload scaled --nvme-path "$dir/scratch" > /dev/null 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  [ -n "$(ls -A "$dir/scratch")" ] && break
  sleep 0.1
done
[ -n "$(ls -A "$dir/scratch")" ] || fail "no scratch directory appeared"
sleep 0.5
kill -TERM "$pid"
wait "$pid"
[ -z "$(ls -A "$dir/scratch")" ] || fail "scratch left after SIGTERM: $(ls "$dir/scratch")"

# --mode serve (the default): every profile side by side; flags it refuses.
out=$("$bin_path" --quiet --max-requests 60 --json "$dir/s.json") || fail "serve run: rc $?"
for p in recompute hbm_lru dram_lru hicache kvtier; do
  grep -q "^$p " <<<"$out" || fail "serve: no $p row: $out"
done
grep -q '"mode": "serve"' "$dir/s.json" || fail "serve: no JSON"
expect2() {
  local what="$1"; shift
  err=$("$bin_path" --quiet "$@" 2>&1); rc=$?
  [ "$rc" -eq 2 ] || fail "$what: rc $rc, want 2: $err"
}
expect2 "negative max-requests" --max-requests -5
grep -q -- "--max-requests -5" <<<"$err" || fail "message does not name the flag and value: $err"
expect2 "negative active params" --active-params -1
expect2 "zero tokens per block" --tokens-per-block 0
expect2 "plot without sweep" --mode cache --plot "$dir/p.png"
expect2 "cache flag in serve mode" --policy lru
grep -q -- "--policy" <<<"$err" || fail "message does not name --policy: $err"
expect2 "serve flag in cache mode" --mode cache --gpu H100
expect2 "unknown GPU" --gpu Z80
expect2 "zero instances" --instances 0
expect2 "unknown router" --router nearest
expect2 "unwritable json" --json /nonexistent-dir/x.json --max-requests 5
expect2 "bad remote size" --remote-size 12XB
grep -q -- "--remote-size" <<<"$err" || fail "message does not name --remote-size: $err"
echo "PASS"
