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

# --compare: only the learned policy runs shadow caches, and the JSON and the report say how many
# prompt blocks they simulated (the same count in both).
out=$(bin --quiet --max-requests 150 --compare --json "$dir/c.json") || fail "--compare: rc $?"
python3 - "$dir/c.json" "$out" <<'PY' || fail "--compare: policy_shadow_accesses"
import json, re, sys
runs = {r["name"]: r for r in json.load(open(sys.argv[1]))["runs"]}
shadow = runs["learned"]["policy_shadow_accesses"]
assert shadow > 0, runs["learned"]
assert all(runs[p]["policy_shadow_accesses"] == 0 for p in ("lru", "cost_aware", "reuse_index"))
m = re.search(r"^learned: shadow caches .* (\d+) prompt blocks simulated$", sys.argv[2], re.M)
assert m and int(m.group(1)) == shadow, (shadow, sys.argv[2])
PY

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
expect2 "cache flag in serve mode" --prefill-instances 2
grep -q -- "--prefill-instances" <<<"$err" || fail "message does not name the flag: $err"
# Serve takes the kvtier profile's policy and hints, names a run off the defaults by them, and
# labels an oracle; pause is the cache replay's alone.
expect2 "pause in serve mode" --hints pause
grep -q -- "pause" <<<"$err" || fail "message does not name pause: $err"
expect2 "unknown serve policy" --policy bogus
grep -q -- "--policy bogus" <<<"$err" || fail "message does not name the flag and value: $err"
out=$("$bin_path" --quiet --max-requests 100 --profile kvtier --policy lru --hints none) ||
  fail "serve --policy lru --hints none: rc $?"
grep -q "^kvtier(lru, none) " <<<"$out" || fail "no kvtier(lru, none) row: $out"
out=$("$bin_path" --quiet --max-requests 100 --profile kvtier --hints oracle-idle) ||
  fail "serve --hints oracle-idle: rc $?"
grep -q "^kvtier(learned, oracle-idle)+oracle " <<<"$out" || fail "oracle not labelled: $out"
# --demote-by-value reaches the kvtier profile in serve mode too, and names the run.
out=$("$bin_path" --quiet --max-requests 100 --profile kvtier --demote-by-value false) ||
  fail "serve --demote-by-value false: rc $?"
grep -q "^kvtier(learned, stop-reason, demote all) " <<<"$out" || fail "demote all not named: $out"
expect2 "unknown preemption" --preemption bogus
grep -q -- "--preemption bogus" <<<"$err" || fail "message does not name the flag and value: $err"
expect2 "serve flag in cache mode" --mode cache --preemption swap
# Swap preemption in a small HBM: decoding victims are swapped, and the run says so.
out=$("$bin_path" --quiet --max-requests 600 --hbm 800blocks --profile dram_lru \
  --preemption swap) || fail "serve --preemption swap: rc $?"
grep -q "swapped [1-9][0-9]* of [1-9][0-9]* preemptions" <<<"$out" || fail "no swap: $out"
expect2 "shared remote not a boolean" --shared-remote maybe
expect2 "serve flag in cache mode" --mode cache --gpu H100
expect2 "unknown GPU" --gpu Z80
expect2 "zero instances" --instances 0
expect2 "unknown router" --router nearest
expect2 "unwritable json" --json /nonexistent-dir/x.json --max-requests 5
expect2 "bad remote size" --remote-size 12XB
grep -q -- "--remote-size" <<<"$err" || fail "message does not name --remote-size: $err"

# Serve-mode sweeps: --sweep over a tier's size, --rate-scale over the offered load.
out=$("$bin_path" --quiet --max-requests 40 --profile hbm_lru --sweep hbm=300blocks,2000blocks \
  --json "$dir/sweep.json") || fail "serve --sweep: rc $?"
[ "$(grep -c '^ *300 hbm_lru ' <<<"$out")" -eq 1 ] && [ "$(grep -c '^ *2000 hbm_lru ' <<<"$out")" -eq 1 ] ||
  fail "serve --sweep: want one row per size: $out"
python3 - "$dir/sweep.json" <<'PY' || fail "serve --sweep JSON"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert [(r["profile"], r["sweep"]) for r in runs] == [
    ("hbm_lru", {"tier": "hbm", "blocks": 300}), ("hbm_lru", {"tier": "hbm", "blocks": 2000})], runs
assert [r["capacity_blocks"]["hbm"] for r in runs] == [300, 2000]
assert all(r["requests"] == 40 and r["finished"] + r["failed"] == 40 for r in runs)
# A larger HBM caches more: never fewer served hits.
assert runs[1]["served_hit_tokens"] >= runs[0]["served_hit_tokens"], runs
assert all(len(r["ttft_percentiles_ms"]) == 101 for r in runs)
assert all(r["ttft_percentiles_ms"][50] == r["ttft_ms"]["p50"] for r in runs)
PY
# --sweep reads sizes as --hbm does: "auto" is the roofline's pool.
out=$("$bin_path" --quiet --max-requests 20 --profile kvtier --sweep dram=0,1GiB \
  --json "$dir/sweep_dram.json") || fail "serve --sweep dram: rc $?"
python3 - "$dir/sweep_dram.json" <<'PY' || fail "serve --sweep dram JSON"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert [r["sweep"]["tier"] for r in runs] == ["dram", "dram"]
assert runs[0]["sweep"]["blocks"] == 0 and runs[0]["capacity_blocks"]["dram"] == -1, runs[0]
assert runs[1]["sweep"]["blocks"] > 0 and runs[1]["capacity_blocks"]["dram"] == runs[1]["sweep"]["blocks"]
PY
# Load sweep: four times the load over the same requests finishes no sooner than at the
# trace's rate (simulated seconds shrink, TTFT does not).
out=$("$bin_path" --quiet --max-requests 40 --profile kvtier --open-loop --rate-scale 1,4 \
  --json "$dir/rate.json") || fail "serve --rate-scale: rc $?"
grep -q '^ *x1 kvtier ' <<<"$out" && grep -q '^ *x4 kvtier ' <<<"$out" ||
  fail "serve --rate-scale: no row per scale: $out"
python3 - "$dir/rate.json" <<'PY' || fail "serve --rate-scale JSON"
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
assert [r["rate_scale"] for r in runs] == [1, 4], runs
assert all("sweep" not in r for r in runs)
assert all(r["finished"] + r["failed"] == 40 for r in runs)
assert runs[1]["simulated_seconds"] < runs[0]["simulated_seconds"], runs
assert runs[1]["ttft_ms"]["p90"] >= runs[0]["ttft_ms"]["p90"], runs
PY
# Deterministic: the same sweep twice gives the same JSON but for wall_seconds.
"$bin_path" --quiet --max-requests 40 --profile kvtier --open-loop --rate-scale 1,4 \
  --json "$dir/rate2.json" >/dev/null || fail "serve --rate-scale again: rc $?"
python3 - "$dir/rate.json" "$dir/rate2.json" <<'PY' || fail "serve --rate-scale not deterministic"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for r in a["runs"] + b["runs"]: del r["wall_seconds"]
assert a == b
PY
expect2 "zero rate scale" --rate-scale 0
grep -q -- "--rate-scale 0" <<<"$err" || fail "message does not name the flag and value: $err"
expect2 "negative rate scale" --rate-scale 1,-2
grep -q -- '"-2"' <<<"$err" || fail "message does not name the value: $err"
expect2 "infinite rate scale" --rate-scale inf
expect2 "rate scale not a number" --rate-scale 2x
expect2 "empty rate scale entry" --rate-scale 1,,2
expect2 "rate scale in cache mode" --mode cache --rate-scale 2
expect2 "sweep and rate scale" --sweep hbm=300blocks --rate-scale 2
expect2 "serve sweep of HBM 0" --sweep hbm=0
grep -q -- "--sweep hbm=0" <<<"$err" || fail "message does not name --sweep: $err"
expect2 "serve sweep bad size" --sweep dram=12XB
expect2 "serve sweep unknown tier" --sweep l3=1GiB
expect2 "serve sweep no sizes" --sweep hbm=
expect2 "unwritable plot" --plot /nonexistent-dir/x.png --max-requests 5
if command -v gnuplot >/dev/null; then
  "$bin_path" --quiet --max-requests 30 --plot "$dir/cdf.png" >/dev/null || fail "serve --plot: rc $?"
  [ "$(head -c 4 "$dir/cdf.png" | od -An -tx1 | tr -d ' ')" = "89504e47" ] || fail "CDF: not a PNG"
  # Five profiles, 101 points each.
  [ "$(grep -c '^[0-9]' "$dir/cdf.png.dat")" -eq 505 ] || fail "CDF data: $(head "$dir/cdf.png.dat")"
  "$bin_path" --quiet --max-requests 30 --profile kvtier --rate-scale 0.5,2 --plot "$dir/rate.png" \
    >/dev/null || fail "serve --rate-scale --plot: rc $?"
  [ "$(head -c 4 "$dir/rate.png" | od -An -tx1 | tr -d ' ')" = "89504e47" ] || fail "sweep: not a PNG"
  grep -q '^0.5 ' "$dir/rate.png.dat" && grep -q '^2 ' "$dir/rate.png.dat" ||
    fail "sweep plot data: $(cat "$dir/rate.png.dat")"
fi
echo "PASS"
