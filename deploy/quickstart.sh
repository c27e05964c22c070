#!/usr/bin/env bash
# From a fresh Debian machine to a working kvferry build: installs the
# dependencies, builds, and prints the version and the GPUs found.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)

./deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"

echo
./build/bin/kvf --version
