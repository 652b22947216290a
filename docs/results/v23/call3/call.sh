source .gpucall/env.sh
C=$1
ftbuild . build-gpu futransformer futransformer_gpu_tests bench_prefill bench_decode_step || { finish; exit 1; }
echo built $(date +%T) >> $L/progress.txt
timeout 60 build-gpu/futransformer_gpu_tests --gtest_filter='ReportGpu.*' > $L/report-tests.log 2>&1; echo "report tests rc=$?" >> $L/progress.txt
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 3 build-gpu/futransformer_gpu_tests --gtest_filter='Kernels/AttentionPrefillGpu.Llama8BShape/wgmma*' > $L/racecheck.log 2>&1; echo "racecheck rc=$?" >> $L/progress.txt
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 build-gpu/futransformer_gpu_tests --gtest_filter='Kernels/AttentionPrefillGpu.Llama8BShape/wgmma*:Fp8ProducersGpu.SwigluFp8*' > $L/memcheck.log 2>&1; echo "memcheck rc=$?" >> $L/progress.txt
echo san $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
E=FT_W4A16_TUNED_EXTRA
export FT_GIT_COMMIT=$C
bash scripts/sweep_decode_tilings.sh build-gpu $L/sw-8b-b16 --batches 16 --pairs 1 \
  "qkv-w8s8x8=$E=6144:4096:9:16:8:8:0:0:8" "qkv-w16s16x8=$E=6144:4096:9:16:16:16:0:0:8" \
  "down-w8s8x8=$E=4096:14336:9:16:8:8:0:0:8" "down-w16s16x8=$E=4096:14336:9:16:16:16:0:0:8" "down-w24s8x8=$E=4096:14336:9:16:24:8:0:0:8" \
  > $L/sw-8b-b16.log 2>&1
echo sw8 $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
B="--configs llama-3.1-8b --tokens 2048 --no-loop --kv int4-hadamard --iters 5"
for i in 1 2; do
  build-gpu/bench_prefill $B --json $L/bp-def-$i.json > $L/bp-def-$i.log 2>&1
  FT_FP8_BLOCK_SWIGLU=1 build-gpu/bench_prefill $B --json $L/bp-blk-$i.json > $L/bp-blk-$i.log 2>&1
done
echo bp $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
bash scripts/sweep_decode_tilings.sh build-gpu $L/sw-70b-b16 --config llama-3.1-70b --batches 16 --pairs 1 \
  "down-w8s8x8=$E=8192:28672:9:16:8:8:0:0:8" "down-w24s8x8=$E=8192:28672:9:16:24:8:0:0:8" > $L/sw-70b-b16.log 2>&1
echo sw70 $(date +%T) >> $L/progress.txt; tar czf $OUT/all.tgz -C $L .
finish
