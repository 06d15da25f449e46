#!/usr/bin/env bash
# session 25 call 6: the final tree: gpu.sh section 9 whole (DSpark on the GPU: greedy
# equality k 1/3/7 on the references, test_spec_engine section 5 on the GPU, sanitizers incl. a
# sampled speculative run and racecheck / synccheck of the argmax, draw and verify kernels, the
# bench at 30 layers, the server speculating greedy and sampled at 1 / 16 / 64 streams)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/load-* /tmp/w
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout 590 scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"
grep -E "^ok|decodes_without|FAILED|checks failed|SUMMARY|verify_rows|5\. sampled|whole step|dspark verification|^\| (1|16|64) |drafts_verified|serve load" $L/s9.log | cut -c1-240 | head -90
echo "[$SECONDS] done"
