#!/usr/bin/env bash
# Session 28 call 7: the session's start (0a97db6) vs its end (7e0a848), the 8B step at batch 1, 8, 16, 32.
set -u
L=$OUT/l; mkdir -p $L
fin() { tar czf $OUT/all.tgz -C $L . ; }
prefix=/tmp/ft-deps; mkdir -p $prefix
for d in .deps/*.deb; do dpkg-deb -x $d $prefix; done
export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
export CMAKE_PREFIX_PATH=$prefix/usr LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu CPATH=$prefix/usr/include
export FT_SHARED_DIR=$PWD/.gpudata/shared
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $L/gpu.csv
rm -rf /tmp/base0 && mkdir -p /tmp/base0 && tar xf .gpucall/base.tar -C /tmp/base0
b() { cmake -S $1 -B $1/build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFT_CUDA=ON > $2.cfg.log 2>&1 && cmake --build $1/build-gpu -j 16 --target $3 > $2.build.log 2>&1; echo "$2 rc=$?" >> $L/t.txt; }
date +%T >> $L/t.txt
b $PWD $L/new "bench_decode_step" & b /tmp/base0 $L/base "bench_decode_step" & wait
date +%T >> $L/t.txt; fin
for r in 1 2; do
  for v in base new; do
    d=$PWD; [ $v = base ] && d=/tmp/base0
  done
done
date +%T >> $L/t.txt
A="--configs llama-3.1-8b --heads int4 --epilogues fused --batches 1,8,16,32 --iters 30"
for r in 1 2; do
  for v in base new; do
    d=$PWD; [ $v = base ] && d=/tmp/base0
    FT_GIT_COMMIT=$([ $v = base ] && echo 0a97db6 || echo 7e0a848) $d/build-gpu/bench_decode_step $A --json $L/dec-$v-$r.json > $L/dec-$v-$r.log 2>&1; fin
  done
done
for v in base new; do grep -h "llama-3.1-8b step" $L/dec-$v-*.log | awk -F'|' -v v=$v '{print v, $6, $8}' ; done | sort -k2,2n -k1,1 > $L/summary.txt
date +%T >> $L/t.txt; fin
