#!/usr/bin/env bash
# Session 28 call 2: base (main 0a97db6) vs v1 (7093a32, group loop) vs v2 (4d0c05a, + panel descriptors and the
# whole-pair fetch test). Tests + racecheck on v2, GEMMs alone, the 8B step at batch 16..32 and the 70B step at 16, 32.
set -u
L=$OUT/l; mkdir -p $L
fin() { tar czf $OUT/all.tgz -C $L . ; }
prefix=/tmp/ft-deps; mkdir -p $prefix
for d in .deps/*.deb; do dpkg-deb -x $d $prefix; done
export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
export CMAKE_PREFIX_PATH=$prefix/usr LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu CPATH=$prefix/usr/include
export FT_SHARED_DIR=$PWD/.gpudata/shared
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $L/gpu.csv
mkdir -p /tmp/base /tmp/v1 && tar xf .gpucall/base.tar -C /tmp/base && tar xf .gpucall/v1.tar -C /tmp/v1
b() { cmake -S $1 -B $1/build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > $2.cfg.log 2>&1 && cmake --build $1/build-gpu -j 6 --target $3 > $2.build.log 2>&1; echo "$2 rc=$?" >> $L/t.txt; }
date +%T >> $L/t.txt
b $PWD $L/v2 "bench_decode_step bench_gemm_w4a16 futransformer_gpu_tests" & b /tmp/base $L/base "bench_decode_step bench_gemm_w4a16" & b /tmp/v1 $L/v1 "bench_decode_step bench_gemm_w4a16" & wait
date +%T >> $L/t.txt; fin
timeout 200 build-gpu/futransformer_gpu_tests --gtest_filter='GemmW4A16Gpu.*:GemmW4A16EpilogueGpu.*:GemmW4A16Host.*:CudaEngine.*' > $L/tests.log 2>&1; echo "tests rc=$?" >> $L/t.txt
grep -E "PASSED|FAILED|SKIPPED \]" $L/tests.log | tail -8 >> $L/t.txt; fin
timeout 100 compute-sanitizer --tool racecheck --racecheck-report hazard build-gpu/futransformer_gpu_tests --gtest_filter='GemmW4A16Gpu.ExplicitTilingsWgmma*' > $L/racecheck.log 2>&1; echo "racecheck rc=$?" >> $L/t.txt
tail -2 $L/racecheck.log >> $L/t.txt; fin
dir() { case $1 in base) echo /tmp/base;; v1) echo /tmp/v1;; v2) echo $PWD;; esac; }
sha() { case $1 in base) echo 0a97db6;; v1) echo 7093a32;; v2) echo 4d0c05a;; esac; }
for r in 1 2; do
  for v in base v1 v2; do
    FT_GIT_COMMIT=$(sha $v) timeout 100 $(dir $v)/build-gpu/bench_gemm_w4a16 --iters 50 --json $L/gemm-$v-$r.json > $L/gemm-$v-$r.log 2>&1; fin
  done
done
date +%T >> $L/t.txt
A="--configs llama-3.1-8b --heads int4 --epilogues fused --batches 16,24,32 --iters 30"
B="--configs llama-3.1-70b --heads int4 --epilogues fused --batches 16,32 --iters 10"
for r in 1 2; do
  for v in base v1 v2; do
    FT_GIT_COMMIT=$(sha $v) $(dir $v)/build-gpu/bench_decode_step $A --json $L/dec-$v-$r.json > $L/dec-$v-$r.log 2>&1; fin
  done
done
for r in 1 2; do
  for v in base v2; do
    FT_GIT_COMMIT=$(sha $v) $(dir $v)/build-gpu/bench_decode_step $B --json $L/dec70-$v-$r.json > $L/dec70-$v-$r.log 2>&1; fin
  done
done
for v in base v1 v2; do grep -h "b step" $L/dec-$v-*.log $L/dec70-$v-*.log 2>/dev/null | awk -F'|' -v v=$v '{print v, $2, $6, $8}' ; done | sort -k2,2 -k4,4n -k1,1 > $L/summary.txt
date +%T >> $L/t.txt; fin
