#!/usr/bin/env bash
# The README's test command: sets up (packages + default model), builds, and runs the CPU test suite with ctest.
# GPU tests (label 'gpu') run only where a CUDA device exists; see scripts/gpu_runner.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "${FT_BUILD_DIR:-$root/build}"
ctest -L cpu --output-on-failure -j "$(nproc)" --timeout 1200
