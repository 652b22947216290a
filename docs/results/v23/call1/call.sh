source .gpucall/env.sh
C=$1   # commit label
S=src/cuda/attention_prefill_wgmma.cuh
mkdir -p /tmp/head && tar xf .gpucall/head.tar -C /tmp/head
rm -rf /tmp/silu && mkdir -p /tmp/silu && tar cf - --exclude=./build-gpu --exclude=./.gpudata --exclude=./.git . | tar xf - -C /tmp/silu && (cd /tmp/silu && patch -p1 -s < .gpucall/silu_fast.patch)
( ftbuild /tmp/head /tmp/head/build-gpu bench_attention_prefill bench_prefill; echo headbuild $? >> $L/progress.txt ) &
( ftbuild /tmp/silu /tmp/silu/build-gpu bench_prefill; echo silubuild $? >> $L/progress.txt ) &
ftbuild . build-gpu futransformer_gpu_tests bench_attention_prefill bench_prefill || { finish; exit 1; }
wait
echo built $(date +%T) >> $L/progress.txt
timeout 90 build-gpu/futransformer_gpu_tests --gtest_filter='*AttentionPrefill*' > $L/tests-s0.log 2>&1; echo "tests s0 rc=$?" >> $L/progress.txt
mkdir -p /tmp/bin; cp build-gpu/bench_attention_prefill /tmp/bin/bap-s0; cp build-gpu/bench_prefill /tmp/bin/bp-s0
for k in 4 6; do
  sed -i "s/constexpr int kPolyEx2Stride = [0-9]*;/constexpr int kPolyEx2Stride = $k;/" $S; touch $S
  if [ $k = 4 ]; then ftbuild . build-gpu futransformer_gpu_tests bench_attention_prefill bench_prefill || { finish; exit 1; }
    timeout 90 build-gpu/futransformer_gpu_tests --gtest_filter='*AttentionPrefill*' > $L/tests-s4.log 2>&1; echo "tests s4 rc=$?" >> $L/progress.txt
  else ftbuild . build-gpu bench_attention_prefill bench_prefill || { finish; exit 1; }; fi
  cp build-gpu/bench_attention_prefill /tmp/bin/bap-s$k; cp build-gpu/bench_prefill /tmp/bin/bp-s$k
done
echo rebuilt $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
for i in 1 2; do
  FT_GIT_COMMIT=2a2bec2 /tmp/head/build-gpu/bench_attention_prefill --iters 10 --json $L/bap-head-$i.json > $L/bap-head-$i.log 2>&1
  for k in 0 4 6; do FT_GIT_COMMIT=$C-s$k /tmp/bin/bap-s$k --iters 10 --json $L/bap-s$k-$i.json > $L/bap-s$k-$i.log 2>&1; done
done
echo bap $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
B="--configs llama-3.1-8b --tokens 2048 --no-loop --kv int4-hadamard --iters 5"
for i in 1 2; do
  FT_GIT_COMMIT=2a2bec2 /tmp/head/build-gpu/bench_prefill $B --profile --json $L/bp-head-$i.json > $L/bp-head-$i.log 2>&1
  FT_GIT_COMMIT=$C-s0 /tmp/bin/bp-s0 $B --profile --json $L/bp-s0-$i.json > $L/bp-s0-$i.log 2>&1
  FT_GIT_COMMIT=$C-s4 /tmp/bin/bp-s4 $B --profile --json $L/bp-s4-$i.json > $L/bp-s4-$i.log 2>&1
  FT_GIT_COMMIT=$C-silufast /tmp/silu/build-gpu/bench_prefill $B --profile --json $L/bp-silu-$i.json > $L/bp-silu-$i.log 2>&1
  echo bp$i $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
done
finish
