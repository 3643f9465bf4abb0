#!/usr/bin/env bash
# The GPU destination on a real GPU, in one short run (about 5 minutes):
#   1. the limit: pinned host-to-device bandwidth of cuda:0 (gpu_h2d_bench)
#   2. a multi-GB checkpoint synthesized on this machine's disk
#   3. loads to cuda:0 with each strategy, page cache hot and (when root can
#      drop it) cold; figures as a ratio to the limit, peak host RSS beside
#   4. checksums of every strategy's device load (copied back) against the
#      host load's, and the dummy-weight kernel against the CPU fill
# Prepared on a CPU machine by bench/gpu/prepare.sh (carry: build-gpu). Writes
# $OUT/gpu_bench.txt (and prints it). SIZE=4GB by default.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$PWD/build-gpu
OUT=${OUT:-$PWD/out}
SIZE=${SIZE:-4GB}
mkdir -p "$OUT"
export WEIGHTLIFT_CUDA_LIBRARY=$B/libweightlift_cuda.so
# A runtime for the table when the machine has none of its own (the kernels
# library also carries one).
if ! ldconfig -p 2>/dev/null | grep -q libcudart && [ -f "$B/libcudart.so.13" ]; then export WEIGHTLIFT_CUDART=$B/libcudart.so.13; fi
report=$OUT/gpu_bench.txt
: >"$report"
say() { echo "$*" | tee -a "$report"; }

say "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>&1 | tee -a "$report"
say "cores $(nproc), memory $(free -g | awk '/Mem/{print $2}') GiB"

say "== the limit: pinned H2D"
limit_line=$("$B/gpu_h2d_bench" 0 1024 2>&1); say "$limit_line"
limit=$(echo "$limit_line" | sed -n 's/.*: \([0-9.]*\) GB\/s in 8 MiB pieces.*/\1/p')

DIR=${DIR:-/tmp/wl-gpu-bench}
say "== checkpoint: $SIZE in $DIR"
rm -rf "$DIR"; "$B/weightlift" synth "$DIR" --size "$SIZE" --shards 4 >/dev/null || { say "synth failed"; exit 1; }
say "$(du -sh "$DIR" | cut -f1) on $(df -T "$DIR" | awk 'NR==2{print $2}')"

cold() {  # drop the page cache when we may
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; return 0; fi
  return 1
}
load() {  # load DEVICE STRATEGY [extra...] -> the summary line
  "$B/weightlift" load "$DIR" --no-progress --device "$@" 2>&1 >/dev/null | grep '^loaded' | tail -1
}
row() {  # row LABEL SUMMARY
  local gbps rss
  gbps=$(echo "$2" | sed -n 's/.*(\([0-9.]*\) GB\/s).*/\1/p')
  rss=$(echo "$2" | sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p')
  say "$(printf '%-28s %7s GB/s  %6s of the H2D limit  peak RSS %8s MiB' "$1" "$gbps" \
        "$(awk -v g="$gbps" -v l="$limit" 'BEGIN{if(l>0) printf "%.0f%%", 100*g/l; else print "?"}')" "$rss")"
}

say "== loads to cuda:0 (hot: after one warm-up read; cold: page cache dropped)"
cat "$DIR"/*.safetensors >/dev/null
for s in lazy eager threads stream; do row "$s hot" "$(load cuda:0 --strategy $s --gds off)"; done
row "stream hot, gds auto" "$(load cuda:0 --strategy stream --gds auto)"
row "host (cpu) stream hot" "$(load cpu --strategy stream)"
if cold; then
  for s in lazy stream; do cold; row "$s cold" "$(load cuda:0 --strategy $s --gds off)"; done
  cold; row "stream cold, gds auto" "$(load cuda:0 --strategy stream --gds auto)"
  cold; row "host (cpu) stream cold" "$(load cpu --strategy stream)"
else
  say "(cold runs skipped: cannot drop the page cache)"
fi

say "== checksums: device loads (copied back) vs the host load"
"$B/weightlift" load "$DIR" --no-progress --checksum --format jsonl >"$OUT/host.jsonl" 2>/dev/null
ok=1
for s in lazy eager threads stream; do
  "$B/weightlift" load "$DIR" --no-progress --checksum --format jsonl --device cuda:0 --strategy $s \
    >"$OUT/cuda-$s.jsonl" 2>"$OUT/cuda-$s.err"
  if cmp -s "$OUT/host.jsonl" "$OUT/cuda-$s.jsonl"; then say "checksums $s: equal ($(wc -l <"$OUT/host.jsonl") tensors)"
  else ok=0; say "checksums $s: DIFFER ($(head -c 300 "$OUT/cuda-$s.err"))"; fi
done
"$B/weightlift" load "$DIR" --no-progress --checksum --format jsonl --device pinned >"$OUT/pinned.jsonl" 2>/dev/null
cmp -s "$OUT/host.jsonl" "$OUT/pinned.jsonl" && say "checksums pinned: equal" || { ok=0; say "checksums pinned: DIFFER"; }

say "== dummy-weight kernel vs the CPU fill"
c=$("$B/weightlift" dummy "$DIR" --hash 2>&1 | grep sha256); g=$("$B/weightlift" dummy "$DIR" --hash --device cuda 2>&1 | grep sha256)
[ -n "$c" ] && [ "$c" = "$g" ] && say "dummy: equal ($c)" || { ok=0; say "dummy: cpu '$c' vs cuda '$g'"; }
rm -rf "$DIR"
[ $ok = 1 ] && say "== all checks passed" || say "== SOME CHECKS FAILED"
