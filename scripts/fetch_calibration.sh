#!/usr/bin/env bash
# The default calibration text for GPTQ: Ambrose Bierce's "The Devil's Dictionary" (1911, public domain), from the
# Debian package dict-devil. It is never evaluation data (WikiText-2 is). Writes it as plain UTF-8 text into the
# cache folder and prints the path.
set -euo pipefail
cache="${FT_CACHE_DIR:-$HOME/.cache/futransformer}"
text="$cache/calibration-devils-dictionary.txt"
if [ ! -s "$text" ]; then
  src=/usr/share/dictd/devil.dict.dz
  if [ ! -f "$src" ]; then
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq dict-devil >/dev/null
  fi
  mkdir -p "$cache"
  # dictzip files are gzip-compatible; the dictd index lines at the top are part of the text and harmless.
  gzip -dc "$src" > "$text.part"
  mv "$text.part" "$text"
fi
echo "$text"
