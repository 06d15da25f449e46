#!/usr/bin/env bash
# session 23 call 1: draw_rows on the GPU (the drafts' probabilistic draws on the device): dspark_check
# (GPU vs CPU), racecheck / synccheck / memcheck on it, gpu.sh section 9, the draft at 30 layers
# with the sampled drafts' line (draws on the device vs on the host)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; C=tests/data/m3.1-flash-shapes.json; D=tests/data/m3.1-flash-dspark-shapes.json; L=/tmp/logs; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "[$SECONDS] dspark_check"
$B/m3 make-tiny --out /tmp/dsp --seed 7 --quant mxfp8-nvfp4 --with-dspark >/dev/null 2>&1
timeout 60 $B/dspark_check /tmp/dsp > $L/dspark_check.log 2>&1; echo "rc $?"; cat $L/dspark_check.log | cut -c1-220
for tool in racecheck synccheck; do
  echo "[$SECONDS] $tool"
  timeout 150 $CS --tool $tool --kernel-name kns=k_draw_rows --error-exitcode 99 --print-limit 20 $B/dspark_check /tmp/dsp > $L/dspark_check-$tool.log 2>&1
  echo "$tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|FAIL" $L/dspark_check-$tool.log | head -5
  save
done
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout 200 scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"; grep -E "FAILED|checks failed|ERROR SUMMARY|draw_rows|probabilistic|5\. sampled|dspark drafts of sampled|whole step" $L/s9.log | cut -c1-260 | head -30
save
echo "[$SECONDS] done"
