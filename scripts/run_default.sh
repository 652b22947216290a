#!/usr/bin/env bash
# The README's main command: sets up, builds, fetches SmolLM2-135M-Instruct and generates a continuation with it.
# Uses the CUDA engine on a Hopper GPU, the CPU reference engine elsewhere (--device auto).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
model="$("$root/scripts/fetch_smollm2.sh")"
prompt="${1:-The three most useful things to know about the Moon are}"
exec "${FT_BUILD_DIR:-$root/build}/futransformer" generate --model "$model" --prompt "$prompt" \
  --max-new-tokens "${FT_MAX_NEW_TOKENS:-64}" --temperature 0 --device auto
