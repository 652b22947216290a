source .gpucall/env.sh
C=$1
Y=src/cuda/attention_prefill_wgmma_layout.h
touch $Y src/cuda/attention_prefill_wgmma.cuh
ftbuild . build-gpu bench_attention_prefill || { finish; exit 1; }
mkdir -p /tmp/bin && cp build-gpu/bench_attention_prefill /tmp/bin/bap-raw3
echo built $(date +%T) >> $L/progress.txt
sed -i 's/static constexpr int kRawPages = 3;/static constexpr int kRawPages = 2;/' $Y && touch $Y
ftbuild . build-gpu bench_attention_prefill || { finish; exit 1; }
echo rebuilt $(date +%T) >> $L/progress.txt
for i in 1 2; do
  FT_GIT_COMMIT=$C /tmp/bin/bap-raw3 --iters 10 --json $L/bap-raw3-$i.json > $L/bap-raw3-$i.log 2>&1
  FT_GIT_COMMIT=$C+raw-pages-2 build-gpu/bench_attention_prefill --iters 10 --json $L/bap-raw2-$i.json > $L/bap-raw2-$i.log 2>&1
done
echo bap $(date +%T) >> $L/progress.txt
sed -i 's/static constexpr int kRawPages = 2;/static constexpr int kRawPages = 3;/' $Y
finish
