#!/usr/bin/env bash
# Installs every Debian package kvtier's build, tests and benchmarks need.
# Idempotent: packages already present are not fetched again, so a second run is offline and fast.
set -euo pipefail

packages=(
  cmake ninja-build pkg-config g++ clang-14 libclang-rt-14-dev
  libabsl-dev liburing-dev libxxhash-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # Used from the tier, remote and replay issues on; installed now so one script serves all.
  libhiredis-dev redis-server redis-tools libzstd-dev liblz4-dev
  nlohmann-json3-dev libcli11-dev gnuplot-nox fio
  # The Python package (pybind11, for Debian's own /usr/bin/python3) and its tests.
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest python3-torch
)

missing=()
for p in "${packages[@]}"; do
  # dpkg-query prints "install ok installed" only for a fully installed package.
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
