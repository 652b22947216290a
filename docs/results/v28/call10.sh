#!/usr/bin/env bash
# Session 28 call 10 (2af8a5c): more in-step screens with the whole-group streamed loop and this session's table entries.
set -u
L=$OUT/l; mkdir -p $L
fin() { tar czf $OUT/all.tgz -C $L . ; }
prefix=/tmp/ft-deps; mkdir -p $prefix
for d in .deps/*.deb; do dpkg-deb -x $d $prefix; done
export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
export CMAKE_PREFIX_PATH=$prefix/usr LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu CPATH=$prefix/usr/include
export FT_SHARED_DIR=$PWD/.gpudata/shared FT_GIT_COMMIT=2af8a5c
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $L/gpu.csv
date +%T >> $L/t.txt
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > $L/cfg.log 2>&1
cmake --build build-gpu -j 16 --target bench_decode_step > $L/build.log 2>&1
echo "build rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
bash scripts/sweep_decode_tilings.sh build-gpu $L/hi --batches 17,24,32 --pairs 3 --iters 30 \
  'down-s8=FT_W4A16_TUNED_EXTRA=4096:14336:17:32:8:8:0:0:8' \
  'down-x16=FT_W4A16_TUNED_EXTRA=4096:14336:17:32:8:16:0:0:0' \
  'qkv-s8=FT_W4A16_TUNED_EXTRA=6144:4096:17:32:8:8:0:0:8' \
  'qkv-x16=FT_W4A16_TUNED_EXTRA=6144:4096:17:32:8:16:0:0:0' \
  'gu-x16-lo=FT_W4A16_TUNED_EXTRA=28672:4096:17:24:8:16:0:0:0' > $L/hi.log 2>&1
echo "hi rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
bash scripts/sweep_decode_tilings.sh build-gpu $L/mid --batches 9,12,16 --pairs 3 --iters 30 \
  'qkv-x16=FT_W4A16_TUNED_EXTRA=6144:4096:9:16:8:16:0:0:0:1' \
  'down-x16=FT_W4A16_TUNED_EXTRA=4096:14336:9:16:8:16:0:0:0:1' > $L/mid.log 2>&1
echo "mid rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
