#!/usr/bin/env bash
# Installs what futransformer needs on a fresh Debian 12 machine (Debian packages only), then fetches the
# default model. Safe to run again: it installs only what is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

packages=(build-essential cmake ninja-build pkg-config git python3 python3-pip
          nlohmann-json3-dev libcli11-dev libgtest-dev libpcre2-dev libopenblas-dev
          clang libclang-rt-14-dev dict-devil)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "${FT_SKIP_MODEL:-0}" != "1" ]; then
  "$here/fetch_smollm2.sh" >/dev/null
  "$here/fetch_calibration.sh" >/dev/null
fi
