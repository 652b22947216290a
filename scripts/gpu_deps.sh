#!/usr/bin/env bash
# Sourced by the GPU call scripts (gpu_runner.sh, gpu_ab.sh). use_local_debs ROOT: packages the build needs but a GPU
# image may lack (PCRE2 headers, say), put as Debian .deb files in ROOT/.deps/, are unpacked into a private prefix
# (never into /) and put on the compiler, pkg-config, CMake and loader paths. Nothing happens without .deb files.
use_local_debs() {
  local root="$1" prefix=/tmp/ft-deps deb
  ls "$root"/.deps/*.deb > /dev/null 2>&1 || return 0
  mkdir -p "$prefix"
  for deb in "$root"/.deps/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  export PKG_CONFIG_PATH="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig:${PKG_CONFIG_PATH:-}"
  export CMAKE_PREFIX_PATH="$prefix/usr:${CMAKE_PREFIX_PATH:-}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  export CPATH="$prefix/usr/include:${CPATH:-}"
}
