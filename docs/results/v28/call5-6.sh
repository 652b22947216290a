#!/usr/bin/env bash
# Session 28 call 5 (7f56397): confirm the screens of call 4 with three pairs: 8B gate_up on the warpgroup path at M = 9..16
# or 12..16, and 8B o with 8 K slices at M = 24..32 together with gate_up on 16 slots at M = 25..32.
set -u
L=$OUT/l; mkdir -p $L
fin() { tar czf $OUT/all.tgz -C $L . ; }
prefix=/tmp/ft-deps; mkdir -p $prefix
for d in .deps/*.deb; do dpkg-deb -x $d $prefix; done
export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
export CMAKE_PREFIX_PATH=$prefix/usr LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu CPATH=$prefix/usr/include
export FT_SHARED_DIR=$PWD/.gpudata/shared FT_GIT_COMMIT=7f56397
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $L/gpu.csv
date +%T >> $L/t.txt
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > $L/cfg.log 2>&1
cmake --build build-gpu -j 16 --target bench_decode_step > $L/build.log 2>&1
echo "build rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
bash scripts/sweep_decode_tilings.sh build-gpu $L/s8b --batches 20,24,28,32 --pairs 3 --iters 30 \
  'o-s8=FT_W4A16_TUNED_EXTRA=4096:4096:24:32:8:8:0:0:8' \
  'o-s8-gu16=FT_W4A16_TUNED_EXTRA=4096:4096:24:32:8:8:0:0:8,28672:4096:25:32:8:16:0:0:0' > $L/s8b.log 2>&1
echo "s8b rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
