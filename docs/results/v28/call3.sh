#!/usr/bin/env bash
# Session 28 call 3: base (main 4d0c05a) vs the working tree (a0b4133, wip/wg-offset-chain: the offset chain in the warpgroup
# kernel at M <= 16). Tests, GEMMs alone, the 8B step at batch 1..16, the 70B step at 16.
set -u
L=$OUT/l; mkdir -p $L
fin() { tar czf $OUT/all.tgz -C $L . ; }
prefix=/tmp/ft-deps; mkdir -p $prefix
for d in .deps/*.deb; do dpkg-deb -x $d $prefix; done
export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
export CMAKE_PREFIX_PATH=$prefix/usr LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu CPATH=$prefix/usr/include
export FT_SHARED_DIR=$PWD/.gpudata/shared
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $L/gpu.csv
mkdir -p /tmp/base && tar xf .gpucall/base.tar -C /tmp/base
b() { cmake -S $1 -B $1/build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > $2.cfg.log 2>&1 && cmake --build $1/build-gpu -j 8 --target $3 > $2.build.log 2>&1; echo "$2 rc=$?" >> $L/t.txt; }
date +%T >> $L/t.txt
b $PWD $L/new "bench_decode_step bench_gemm_w4a16 futransformer_gpu_tests" & b /tmp/base $L/base "bench_decode_step bench_gemm_w4a16" & wait
date +%T >> $L/t.txt; fin
timeout 200 build-gpu/futransformer_gpu_tests --gtest_filter='GemmW4A16Gpu.*:GemmW4A16EpilogueGpu.*:GemmW4A16Host.*:CudaEngine.*' > $L/tests.log 2>&1; echo "tests rc=$?" >> $L/t.txt
grep -E "PASSED|FAILED|SKIPPED \]" $L/tests.log | tail -8 >> $L/t.txt; fin
timeout 100 compute-sanitizer --tool racecheck --racecheck-report hazard build-gpu/futransformer_gpu_tests --gtest_filter='GemmW4A16Gpu.ExplicitTilingsWgmma*' > $L/racecheck.log 2>&1; echo "racecheck rc=$?" >> $L/t.txt
tail -2 $L/racecheck.log >> $L/t.txt; fin
for r in 1 2; do
  for v in base new; do
    d=$PWD; [ $v = base ] && d=/tmp/base
    FT_GIT_COMMIT=$([ $v = base ] && echo 4d0c05a || echo a0b4133) timeout 100 $d/build-gpu/bench_gemm_w4a16 --iters 50 --json $L/gemm-$v-$r.json > $L/gemm-$v-$r.log 2>&1; fin
  done
done
date +%T >> $L/t.txt
A="--configs llama-3.1-8b --heads int4 --epilogues fused --batches 1,8,12,16,20 --iters 30"
for r in 1 2; do
  for v in base new; do
    d=$PWD; [ $v = base ] && d=/tmp/base
    FT_GIT_COMMIT=$([ $v = base ] && echo 4d0c05a || echo a0b4133) $d/build-gpu/bench_decode_step $A --json $L/dec-$v-$r.json > $L/dec-$v-$r.log 2>&1; fin
  done
done
for v in base new; do grep -h "llama-3.1-8b step" $L/dec-$v-*.log | awk -F'|' -v v=$v '{print v, $6, $8}' ; done | sort -k2,2n -k1,1 > $L/summary.txt
date +%T >> $L/t.txt; fin
B="--configs llama-3.1-70b --heads int4 --epilogues fused --batches 12,16 --iters 10"
for r in 1 2; do
  for v in base new; do
    d=$PWD; [ $v = base ] && d=/tmp/base
    $d/build-gpu/bench_decode_step $B --json $L/dec70-$v-$r.json > $L/dec70-$v-$r.log 2>&1; fin
  done
done
for v in base new; do grep -h "b step" $L/dec70-$v-*.log | awk -F'|' -v v=$v '{print v, $2, $6, $8}' ; done | sort -k4,4n -k1,1 >> $L/summary.txt
date +%T >> $L/t.txt; fin
