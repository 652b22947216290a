#!/usr/bin/env bash
# Configures and builds futransformer into ${FT_BUILD_DIR:-build} (Release, ninja, all cores). Extra arguments go
# to cmake (e.g. -DFT_SANITIZE=ON).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FT_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${FT_BUILD_TYPE:-Release}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
