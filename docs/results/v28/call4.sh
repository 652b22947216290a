#!/usr/bin/env bash
# Session 28 call 4 (7f56397): in-step screens after the faster streamed warpgroup loop (4d0c05a). M = 9..16 entries on
# the warpgroup path (the new tenth field) for 8B gate_up / o and 70B o / down; 8B o with 8 K slices and gate_up on
# 16 slots at M = 17..32.
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
cmake --build build-gpu -j 16 --target bench_decode_step futransformer_gpu_tests > $L/build.log 2>&1
echo "build rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
build-gpu/futransformer_gpu_tests --gtest_filter='GemmW4A16Host.*' > $L/host.log 2>&1; echo "host rc=$?" >> $L/t.txt
FT_PRINT_HEURISTICS=1 FT_W4A16_TUNED_EXTRA=28672:4096:9:16:8:8:0:0:0:1,4096:4096:9:16:8:8:0:0:0:1 build-gpu/bench_decode_step --configs llama-3.1-8b --heads int4 --epilogues fused --batches 12 --iters 2 2>&1 | grep -i "gemm_w4a16 M=\|warn\|TUNED" | sort | uniq -c > $L/heur.txt; fin
bash scripts/sweep_decode_tilings.sh build-gpu $L/s8 --batches 9,12,16 --pairs 2 --iters 30 \
  'gu-sx=FT_W4A16_TUNED_EXTRA=28672:4096:9:16:8:8:0:0:0:1' \
  'gu-sx16=FT_W4A16_TUNED_EXTRA=28672:4096:9:16:8:16:0:0:0:1' \
  'o-sx=FT_W4A16_TUNED_EXTRA=4096:4096:9:16:8:8:0:0:0:1' > $L/s8.log 2>&1
echo "s8 rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
bash scripts/sweep_decode_tilings.sh build-gpu $L/s8b --batches 17,24,32 --pairs 2 --iters 30 \
  'o-s8=FT_W4A16_TUNED_EXTRA=4096:4096:17:32:8:8:0:0:8' \
  'gu-16=FT_W4A16_TUNED_EXTRA=28672:4096:25:32:8:16:0:0:0' > $L/s8b.log 2>&1
echo "s8b rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
bash scripts/sweep_decode_tilings.sh build-gpu $L/s70 --config llama-3.1-70b --batches 12,16 --pairs 2 --iters 10 \
  'o-sx=FT_W4A16_TUNED_EXTRA=8192:8192:9:16:8:8:0:0:0:1' \
  'down-sx=FT_W4A16_TUNED_EXTRA=8192:28672:9:16:8:8:0:0:0:1' > $L/s70.log 2>&1
echo "s70 rc=$?" >> $L/t.txt; date +%T >> $L/t.txt; fin
