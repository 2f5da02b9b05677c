#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU (well under 8 minutes):
#   1. tests/cuda (device probe, self-test kernel, CudaHbm through pinned DRAM and the engine;
#      layer-wise onboarding: a layer-major batch with a fence per layer a stream waits on, a
#      caller's CUDA event as a Completion, a KvCache ticket a stream waits on layer by layer,
#      in all three layouts);
#   2. the tier conformance suite against CudaHbm in the three layouts;
#   3. kvtier_gpu_bench: HBM <-> pinned DRAM for 64 KiB, 256 KiB and 2 MiB blocks, both layouts,
#      against plain cudaMemcpyAsync of the same sizes (target >= 0.9x at 2 MiB);
# then a summary. It uses build/device-bundle (bench/gpu/make_device_bundle.sh, carried to the
# device) when present, else builds with the `cuda` preset (needs scripts/install-deps.sh's
# packages). Exit status: 0 when every check passed and no GPU test was skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
bundle=${KVTIER_DEVICE_BUNDLE:-build/device-bundle}
log_dir=${OUT:-/tmp}/kvtier-device-checks
mkdir -p "$log_dir"

if [ -x "$bundle/bin/kvtier_gpu_bench" ]; then
  # The driver's libcuda comes from this machine; everything else from the bundle.
  driver_dirs=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1/ {print $NF}' | xargs -r -n1 dirname | sort -u | paste -sd:)
  libs="$PWD/$bundle/lib:${driver_dirs:-/usr/lib/x86_64-linux-gnu}:/usr/local/nvidia/lib64:/usr/lib64"
  run() { local bin=$1; shift; "$PWD/$bundle/lib/ld-linux-x86-64.so.2" --library-path "$libs" "$PWD/$bundle/bin/$bin" "$@"; }
  echo "device checks: using the carried bundle in $bundle"
else
  echo "device checks: no bundle; building with the cuda preset"
  cmake --preset cuda >/dev/null && cmake --build --preset cuda \
      --target kvtier_cuda_tests kvtier_conformance_tests kvtier_gpu_bench || exit 2
  run() { local bin=$1; shift; local p; p=$(find build/cuda -name "$bin" -type f | head -1); "$p" "$@"; }
fi

nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not available)"
status=0

echo "== 1. tests/cuda"
timeout 180 bash -c "$(declare -f run); libs='${libs:-}'; bundle='$bundle'; run kvtier_cuda_tests" \
  2>&1 | tee "$log_dir/cuda_tests.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED \]|Skipped' | head -40
cuda_passed=$(grep -c '^\[       OK \]' "$log_dir/cuda_tests.log")
cuda_failed=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$log_dir/cuda_tests.log")
cuda_skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z]' "$log_dir/cuda_tests.log")
[ "$cuda_failed" -eq 0 ] && [ "$cuda_passed" -gt 0 ] && [ "$cuda_skipped" -eq 0 ] || status=1

echo "== 2. conformance suite on CudaHbm"
timeout 120 bash -c "$(declare -f run); libs='${libs:-}'; bundle='$bundle'; run kvtier_conformance_tests --gtest_filter='*CudaHbm*'" \
  2>&1 | tee "$log_dir/conformance.log" | tail -5
conf_passed=$(grep -c '^\[       OK \]' "$log_dir/conformance.log")
conf_failed=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$log_dir/conformance.log")
[ "$conf_failed" -eq 0 ] && [ "$conf_passed" -gt 0 ] || status=1

echo "== 3. HBM <-> pinned DRAM bandwidth"
timeout 240 bash -c "$(declare -f run); libs='${libs:-}'; bundle='$bundle'; run kvtier_gpu_bench --benchmark_min_time=0.2 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true" \
  2>&1 | tee "$log_dir/gpu_bench.log" | grep -E '_median|ratios|targets|x  |PASS|MISS|ERROR' | head -60
grep -q 'MISS\|ERROR' "$log_dir/gpu_bench.log" && status=1

echo "== summary"
echo "cuda tests: $cuda_passed passed, $cuda_failed failed, $cuda_skipped skipped"
echo "conformance (CudaHbm): $conf_passed passed, $conf_failed failed"
sed -n '/---- ratios/,$p' "$log_dir/gpu_bench.log"
echo "device checks took $((SECONDS - start)) s; status $status"
exit $status
