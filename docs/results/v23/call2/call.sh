source .gpucall/env.sh
C=$1
mkdir -p /tmp/head && tar xf .gpucall/head.tar -C /tmp/head
( ftbuild /tmp/head /tmp/head/build-gpu bench_prefill bench_decode_step; echo headbuild $? >> $L/progress.txt ) &
ftbuild . build-gpu futransformer_gpu_tests bench_prefill bench_decode_step || { finish; exit 1; }
wait
echo built $(date +%T) >> $L/progress.txt
B="--configs llama-3.1-8b --tokens 2048 --no-loop --kv int4-hadamard --iters 5"
for i in 1 2 3; do
  FT_GIT_COMMIT=2a2bec2 /tmp/head/build-gpu/bench_prefill $B --profile --json $L/bp-head-$i.json > $L/bp-head-$i.log 2>&1
  FT_GIT_COMMIT=$C build-gpu/bench_prefill $B --profile --json $L/bp-new-$i.json > $L/bp-new-$i.log 2>&1
done
echo bp $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
D="--configs llama-3.1-8b --batches 1,8,32 --heads int4 --epilogues fused --iters 50"
for i in 1 2; do
  FT_GIT_COMMIT=2a2bec2 /tmp/head/build-gpu/bench_decode_step $D --json $L/bd-head-$i.json > $L/bd-head-$i.log 2>&1
  FT_GIT_COMMIT=$C build-gpu/bench_decode_step $D --json $L/bd-new-$i.json > $L/bd-new-$i.log 2>&1
done
echo bd $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
timeout 420 build-gpu/futransformer_gpu_tests --gtest_brief=1 > $L/gpu-tests.log 2>&1; echo "gpu tests rc=$?" >> $L/progress.txt
echo tests $(date +%T) >> $L/progress.txt
finish
