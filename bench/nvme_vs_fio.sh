#!/usr/bin/env bash
# NVMe tier against fio on the same file, block size, size and queue depth, in one run: writes,
# then reads, of 2 MiB blocks at depth 16 with io_uring and O_DIRECT. Both report payload bytes
# per second; our slots also carry a 4 KiB header per block (not counted in our favour).
# The last line is exactly: ratio read=R write=W   (ours / fio; target >= 0.9 each).
#
# Usage: bench/nvme_vs_fio.sh [FILE] [SIZE_MIB] [SECONDS]
#   FILE defaults to a file in $TMPDIR or /tmp (put it on the NVMe device you measure);
#   SIZE_MIB 1024, SECONDS 5 per pass. Needs fio (scripts/install-deps.sh) and a built
#   kvtier_nvme_throughput (cmake --build --preset default --target kvtier_nvme_throughput).
set -euo pipefail
cd "$(dirname "$0")/.."

file=${1:-${TMPDIR:-/tmp}/kvtier_nvme_vs_fio.bin}
size_mib=${2:-1024}
seconds=${3:-5}
bs=2097152
depth=16
ours=${KVTIER_NVME_THROUGHPUT:-build/default/bench/kvtier_nvme_throughput}
[ -x "$ours" ] || { echo "missing $ours: build the kvtier_nvme_throughput target" >&2; exit 2; }
command -v fio >/dev/null || { echo "fio not found: run scripts/install-deps.sh" >&2; exit 2; }
trap 'rm -f "$file"' EXIT
size=$((size_mib * 1048576))

fio_bps() {  # fio_bps write|read -> bytes per second
  fio --name=kvtier --filename="$file" --size="$size" --bs=$bs --iodepth=$depth \
      --ioengine=io_uring --direct=1 --rw="$1" --time_based --runtime="$seconds" \
      --fixedbufs --registerfiles --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(j['$1']['bw_bytes'])"
}

ours_bps() {  # ours_bps write|read -> bytes per second
  "$ours" --path="$file" --size="$size" --block=$bs --depth=$depth --seconds="$seconds" \
      --mode="$1" | sed -n 's/^bytes_per_second=//p'
}

rm -f "$file"
fio_write=$(fio_bps write)
ours_write=$(ours_bps write)   # also leaves valid blocks for our read pass
fio_read=$(fio_bps read)
ours_read=$(ours_bps read)

python3 - "$fio_write" "$ours_write" "$fio_read" "$ours_read" <<'PY'
import sys
fw, ow, fr, orr = (float(x) for x in sys.argv[1:])
mib = 1048576
print(f"write: fio {fw/mib:9.1f} MiB/s   kvtier {ow/mib:9.1f} MiB/s")
print(f"read:  fio {fr/mib:9.1f} MiB/s   kvtier {orr/mib:9.1f} MiB/s")
print(f"ratio read={orr/fr:.3f} write={ow/fw:.3f}")
PY
