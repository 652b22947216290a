source .gpucall/env.sh
C=$1
Y=src/cuda/attention_prefill_wgmma_layout.h
ftbuild . build-gpu bench_attention_prefill bench_prefill || { finish; exit 1; }
echo built $(date +%T) >> $L/progress.txt
FT_GIT_COMMIT=$C build-gpu/bench_prefill --configs llama-3.1-8b --tokens 2048 --no-loop --kv int4-hadamard --iters 5 --trace $L/trace.json --json $L/bp-trace.json > $L/bp-trace.log 2>&1
echo trace $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
mkdir -p /tmp/bin && cp build-gpu/bench_attention_prefill /tmp/bin/bap-3
sed -i 's/static constexpr int kStagesInt4 = 3;/static constexpr int kStagesInt4 = 4;/' $Y && touch $Y
ftbuild . build-gpu bench_attention_prefill || { finish; exit 1; }
echo rebuilt $(date +%T) >> $L/progress.txt
for i in 1 2; do
  FT_GIT_COMMIT=$C /tmp/bin/bap-3 --iters 10 --json $L/bap-3st-$i.json > $L/bap-3st-$i.log 2>&1
  FT_GIT_COMMIT=$C+int4-4-stages build-gpu/bench_attention_prefill --iters 10 --json $L/bap-4st-$i.json > $L/bap-4st-$i.log 2>&1
done
echo bap $(date +%T) >> $L/progress.txt
finish
