#!/usr/bin/env bash
# Builds the GPU checks here (the `cuda` preset, sm_90) and packs them with every shared library
# they load except the NVIDIA driver's, plus this machine's dynamic loader, into
# build/device-bundle/. The device machine has CUDA but none of our Debian packages and no
# network, so run_device_checks.sh runs these binaries through the carried loader.
#
# Usage: bench/gpu/make_device_bundle.sh   then carry build/device-bundle to the device.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(kvtier_cuda_tests kvtier_conformance_tests kvtier_gpu_bench)
cmake --preset cuda >/dev/null
cmake --build --preset cuda --target "${targets[@]}"

out=build/device-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp build/cuda/tests/kvtier_cuda_tests build/cuda/tests/kvtier_conformance_tests \
   build/cuda/bench/kvtier_gpu_bench "$out/bin/"
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/libcuda\.so|/libnvidia' | while read -r lib; do
  cp -L "$lib" "$out/lib/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$out/lib/"
du -sh "$out"
