#!/usr/bin/env bash
# session 23 call 3: gpu.sh section 9 as committed (racecheck / synccheck on the draw kernel through
# dspark_check --ops-only; the server speculating greedy and sampled at 1 / 16 / 64 streams, each
# load run removing its checkpoint)
set -u
cd "$(dirname "$0")/../../.."
mkdir -p .gpu_bin && tar -C .gpu_bin -xJf .gpu_pack/bin.tar.xz && xz -dc .gpu_pack/tokenizer.json.xz > /tmp/tok.json
B=.gpu_bin; L=/tmp/logs; rm -rf $L; mkdir -p $L
save() { tar -C /tmp -cJf $OUT/logs.tar.xz logs; }
trap save EXIT
rm -rf /tmp/load-* /tmp/w /tmp/dsp
echo "[$SECONDS] section 9"
M3_TOKENIZER=/tmp/tok.json M3_GPU_SECTIONS="9" timeout 470 scripts/gpu.sh $B /tmp/w > $L/s9.log 2>&1
echo "section 9 rc $?"; grep -E "^== .*(racecheck|synccheck)|RACECHECK SUMMARY|ERROR SUMMARY|FAILED|checks failed|^\| |MAL|dspark drafts of sampled|whole step" $L/s9.log | cut -c1-220 | head -40
echo "[$SECONDS] done"
