#!/usr/bin/env bash
# The GPU path on a real GPU, every door, in one short run (under 5 minutes
# for the default 4 GB on an H200); prints ONE table and writes it, the
# once-per-process costs and the checks to $OUT/gpu_bench.txt.
#
#   on this (CPU) machine:   bench/gpu/prepare.sh            (fills build-gpu/)
#   on the device machine:   bench/gpu/run.sh                (run's carry: ["build-gpu"])
#   dry run here (fake GPU): DRY=1 bench/gpu/run.sh          (every line but the real GPU)
#
# Rows: the limit (torch's pinned 1 GiB host-to-device copy; gpu_h2d_bench
# beside it), the CLI to cuda:0 with each strategy hot, A/B rows for each new
# mechanism (the old ring shape, per-file strategies as asked, GDS auto as
# before, copies out of the registered page cache), each Python door's first
# load in a fresh process and its steady figure, safetensors' own
# load_file(device="cuda") as the peer, and cold loads against the disk's
# own parallel O_DIRECT read. Columns: GB/s, share of the limit, peak host RSS.
# Then: every strategy's device checksums against the host load, pinned,
# every Python door's tensors, the dummy-weight kernel against the CPU fill.
#
# SIZE (4GB), DIR (/tmp/wl-gpu-bench), OUT ($PWD/out), PYTHON (python3),
# REPS (3: best of, for the hot CLI rows).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
B=$ROOT/build-gpu
OUT=${OUT:-$ROOT/out}
DRY=${DRY:-0}
SIZE=${SIZE:-4GB}
REPS=${REPS:-3}
PY=${PYTHON:-python3}
DIR=${DIR:-/tmp/wl-gpu-bench}
mkdir -p "$OUT"
report=$OUT/gpu_bench.txt
: >"$report"
say() { echo "$*" | tee -a "$report"; }

# What prepare.sh carried: the CLI and its libraries (a private path), the
# kernels library, the cp312 package. Without build-gpu/ (a dry run before
# prepare.sh): this checkout's build.
if [ -d "$B" ]; then
  export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export WEIGHTLIFT_CUDA_LIBRARY=$B/libweightlift_cuda.so
else
  B=$ROOT/build/bin
fi
if [ "$DRY" = 1 ]; then
  # The fake backend (host memory for device memory) and the package seam
  # that stands in for torch's CUDA; this checkout's Python package (.venv).
  export WEIGHTLIFT_GPU_BACKEND=fake WEIGHTLIFT_TEST_TORCH_CUDA=0
  SIZE=${DRY_SIZE:-96MB}
  PY=${PYTHON:-$ROOT/.venv/bin/python}
else
  export PYTHONPATH=$B/py${PYTHONPATH:+:$PYTHONPATH}
fi
CLI=$B/weightlift
H2D=$B/gpu_h2d_bench
[ -x "$CLI" ] || { echo "run.sh: no $CLI (run bench/gpu/prepare.sh first)" >&2; exit 1; }

say "== machine ($(date -u +%Y-%m-%dT%H:%MZ), weightlift $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader 2>&1 | tee -a "$report"
else
  say "no nvidia-smi${WEIGHTLIFT_GPU_BACKEND:+ (backend: $WEIGHTLIFT_GPU_BACKEND)}"
fi
say "cores $(nproc), memory $(free -g | awk '/Mem/{print $2}') GiB, python $($PY -c 'import sys,torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -1)"

rows=()   # "label|gbps|rss" in table order
limit=0
add() { rows+=("$1|$2|$3"); }
gbps_of() { sed -n 's/.*(\([0-9.]*\) GB\/s).*/\1/p' <<<"$1"; }
rss_of() { sed -n 's/.*peak RSS \([0-9.]*\) MiB.*/\1/p' <<<"$1"; }

# One CLI load to cuda:0 (extra args after the label): the summary line.
load1() { "$CLI" load "$DIR" --no-progress "$@" 2>&1 >/dev/null | grep '^loaded' | tail -1; }
# The best of REPS loads (env assignments first, then CLI args): a row.
cli_row() {
  local label=$1; shift
  local envs=() best=0 rss=0 line g
  while [ $# -gt 0 ] && [[ $1 == *=* ]]; do envs+=("$1"); shift; done
  for _ in $(seq "$REPS"); do
    line=$(env "${envs[@]}" "$CLI" load "$DIR" --no-progress "$@" 2>&1 >/dev/null | grep '^loaded' | tail -1)
    g=$(gbps_of "$line")
    [ -n "$g" ] || { say "row '$label' failed: $(env "${envs[@]}" "$CLI" load "$DIR" --no-progress "$@" 2>&1 | tail -2)"; return; }
    if awk -v a="$g" -v b="$best" 'BEGIN{exit !(a>b)}'; then best=$g; rss=$(rss_of "$line"); fi
  done
  add "$label" "$best" "$rss"
  echo "$label: $line" >>"$OUT/cli_lines.txt"
}
cold() {  # drop the page cache when we may
  sync
  [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches
}
door() {  # door NAME [env...]: one Python door in a fresh process -> $OUT/door-NAME.json
  local name=$1 which=$2; shift 2
  env "$@" "$PY" "$ROOT/bench/gpu/doors.py" "$which" "$DIR" "$OUT/host.jsonl" >"$OUT/door-$name.json" \
    2>"$OUT/door-$name.err" || echo "{\"door\": \"$name\", \"na\": \"failed, see door-$name.err\"}" >"$OUT/door-$name.json"
}
jq_() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); v=d.get(sys.argv[2]); print('' if v is None else v)" "$@"; }

# ---- the limit ------------------------------------------------------------------------------
"$PY" "$ROOT/bench/gpu/doors.py" limit >"$OUT/limit.json" 2>"$OUT/limit.err"
torch_limit=$(jq_ "$OUT/limit.json" gbps)
h2d_line=$("$H2D" 0 1024 2>&1)
h2d=$(sed -n 's/.*: \([0-9.]*\) GB\/s in 8 MiB pieces.*/\1/p' <<<"$h2d_line")
limit=${torch_limit:-$h2d}
[ -n "$torch_limit" ] && add "limit: torch pinned 1 GiB H2D copy" "$torch_limit" ""
add "limit: gpu_h2d_bench, 8 MiB pieces, 2 streams" "$h2d" ""

# ---- the checkpoint, hot -----------------------------------------------------------------------
rm -rf "$DIR"
"$CLI" synth "$DIR" --size "$SIZE" --shards 4 >/dev/null || { say "synth failed"; exit 1; }
say "checkpoint: $(du -sh "$DIR" | cut -f1) in 4 files on $(df -T "$DIR" | awk 'NR==2{print $2}') ($(df "$DIR" | awk 'NR==2{print $1}'))"
"$CLI" load "$DIR" --no-progress --checksum --format jsonl >"$OUT/host.jsonl" 2>/dev/null
cat "$DIR"/*.safetensors >/dev/null

cli_row "CLI stream (defaults: gds auto)" --device cuda:0 --strategy stream
cli_row "CLI stream --gds off" --device cuda:0 --strategy stream --gds off
cli_row "CLI auto (defaults)" --device cuda:0
cli_row "CLI lazy (streams now)" --device cuda:0 --strategy lazy
cli_row "CLI eager (streams now)" --device cuda:0 --strategy eager
cli_row "CLI threads (streams now)" --device cuda:0 --strategy threads
cli_row "A/B: copies out of the page cache (mapped)" WEIGHTLIFT_H2D_SOURCE=mapped --device cuda:0 --strategy stream
cli_row "A/B: copies through slots (slot)" WEIGHTLIFT_H2D_SOURCE=slot --device cuda:0 --strategy stream
cli_row "A/B: before: ring 8x8MiB, 8 threads" WEIGHTLIFT_PINNED_RING=8x8MiB --device cuda:0 --strategy stream --threads 8
cli_row "A/B: before: lazy as asked" WEIGHTLIFT_DEVICE_STRATEGY=asked --device cuda:0 --strategy lazy
cli_row "A/B: before: gds auto trusts cuFile" WEIGHTLIFT_GDS_AUTO=cufile --device cuda:0 --strategy stream
cli_row "host memory (cpu) stream, for scale" --device cpu --strategy stream

"$CLI" load "$DIR" --no-progress --device cuda:0 --verbose 2>"$OUT/verbose.txt" >/dev/null

# ---- the Python doors (each a fresh process: its first load, then steady) ------------------------
door fastsafetensors fastsafetensors
door instanttensor instanttensor
door load_file load_file
door safetensors safetensors
door fastsafetensors-nowarmup fastsafetensors WEIGHTLIFT_GPU_WARMUP=0 WL_DOOR_LOADS=2 WL_DOOR_CHECK=0
door fastsafetensors-wholering fastsafetensors WEIGHTLIFT_RING_GROW=0 WL_DOOR_LOADS=2 WL_DOOR_CHECK=0
door dummy dummy
for d in fastsafetensors instanttensor load_file safetensors fastsafetensors-nowarmup fastsafetensors-wholering; do
  f=$OUT/door-$d.json
  na=$(jq_ "$f" na)
  label="python $d"; [ "$d" = safetensors ] && label="peer: safetensors load_file(device=cuda)"
  [ "$d" = fastsafetensors-nowarmup ] && label="A/B: python fastsafetensors, no warm-up"
  [ "$d" = fastsafetensors-wholering ] && label="A/B: python fastsafetensors, whole ring pinned first"
  if [ -n "$na" ]; then add "$label ($na)" "n/a" ""; continue; fi
  add "$label, first load" "$(jq_ "$f" first_gbps)" "$(jq_ "$f" peak_rss_mib)"
  case $d in
    *-nowarmup | *-wholering) ;;
    *) add "$label, steady" "$(jq_ "$f" steady_gbps)" "$(jq_ "$f" peak_rss_mib)" ;;
  esac
done

# ---- cold ----------------------------------------------------------------------------------------
if [ "$DRY" != 1 ] && cold; then
  cold; t0=$(date +%s.%N)
  for f in "$DIR"/*.safetensors; do dd if="$f" of=/dev/null bs=8M iflag=direct status=none & done; wait
  t1=$(date +%s.%N); bytes=$(cat "$DIR"/*.safetensors | wc -c)
  add "cold: the disk's own O_DIRECT read, 4 files in parallel" "$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN{printf "%.2f", b/(c-a)/1e9}')" ""
  cold; line=$(load1 --device cuda:0 --strategy stream --gds off)
  add "cold: CLI stream --gds off" "$(gbps_of "$line")" "$(rss_of "$line")"
  cold; line=$(load1 --device cuda:0 --strategy stream)
  add "cold: CLI stream (gds auto)" "$(gbps_of "$line")" "$(rss_of "$line")"
  cold; line=$(load1 --device cuda:0 --strategy lazy --gds off)
  add "cold: CLI lazy (streams now)" "$(gbps_of "$line")" "$(rss_of "$line")"
else
  say "(cold rows skipped: $([ "$DRY" = 1 ] && echo 'dry run' || echo 'cannot drop the page cache'))"
fi

# ---- the table -----------------------------------------------------------------------------------
say ""
say "$(printf '%-66s %9s %9s %12s' door GB/s 'of limit' 'peak RSS')"
for r in "${rows[@]}"; do
  IFS='|' read -r label g rss <<<"$r"
  share=$(awk -v g="$g" -v l="$limit" 'BEGIN{if (l > 0 && g+0 > 0) printf "%.0f%%", 100*g/l; else print "-"}')
  [[ $g =~ ^[0-9.]+$ ]] && g=$(printf '%.2f' "$g")
  [[ $rss =~ ^[0-9.]+$ ]] && rss="$(printf '%.0f' "$rss") MiB"
  say "$(printf '%-66s %9s %9s %12s' "$label" "$g" "$share" "$rss")"
done
say "(the limit: $([ -n "$torch_limit" ] && echo "torch's pinned copy" || echo gpu_h2d_bench) $limit GB/s; hot rows best of $REPS)"

# ---- what a process pays once --------------------------------------------------------------------
say ""
say "== once per process"
say "CLI: $(grep '^gpu: once per process' "$OUT/verbose.txt" | sed 's/^gpu: once per process: //')"
grep -E '^(stream|auto|lazy)' "$OUT/verbose.txt" | head -4 | sed 's/^/CLI log: /' | tee -a "$report" >/dev/null
for d in fastsafetensors instanttensor load_file fastsafetensors-nowarmup; do
  c=$(jq_ "$OUT/door-$d.json" costs); [ -n "$c" ] && say "python $d: $c"
done

# ---- checks --------------------------------------------------------------------------------------
say ""
say "== checks"
ok=1
for s in stream lazy eager; do
  "$CLI" load "$DIR" --no-progress --checksum --format jsonl --device cuda:0 --strategy $s >"$OUT/cuda-$s.jsonl" 2>"$OUT/cuda-$s.err"
  if cmp -s "$OUT/host.jsonl" "$OUT/cuda-$s.jsonl"; then say "checksums $s: equal ($(wc -l <"$OUT/host.jsonl") tensors)"
  else ok=0; say "checksums $s: DIFFER ($(head -c 300 "$OUT/cuda-$s.err"))"; fi
done
WEIGHTLIFT_H2D_SOURCE=mapped "$CLI" load "$DIR" --no-progress --checksum --format jsonl --device cuda:0 >"$OUT/cuda-mapped.jsonl" 2>/dev/null
if cmp -s "$OUT/host.jsonl" "$OUT/cuda-mapped.jsonl"; then say "checksums mapped: equal"; else ok=0; say "checksums mapped: DIFFER"; fi
"$CLI" load "$DIR" --no-progress --checksum --format jsonl --device pinned >"$OUT/pinned.jsonl" 2>/dev/null
if cmp -s "$OUT/host.jsonl" "$OUT/pinned.jsonl"; then say "checksums pinned: equal"; else ok=0; say "checksums pinned: DIFFER"; fi
for d in fastsafetensors instanttensor load_file safetensors; do
  f=$OUT/door-$d.json  # (the no-warm-up door is timed only)
  if [ -n "$(jq_ "$f" na)" ]; then say "python $d: n/a ($(jq_ "$f" na))"; continue; fi
  if [ "$(jq_ "$f" equal)" = True ]; then say "python $d: every tensor equal ($(jq_ "$f" tensors), on $(jq_ "$f" device))"
  else ok=0; say "python $d: DIFFER ($(jq_ "$f" mismatch))"; fi
done
case "$(jq_ "$OUT/door-dummy.json" ok)" in
  True) say "python dummy weights on cuda: equal to the CPU fill" ;;
  "") say "python dummy weights on cuda: n/a ($(jq_ "$OUT/door-dummy.json" na))" ;;
  *) ok=0; say "python dummy weights on cuda: DIFFER" ;;
esac
c=$("$CLI" dummy "$DIR" --hash 2>&1 | grep sha256); g=$("$CLI" dummy "$DIR" --hash --device cuda 2>&1 | grep sha256)
if [ -n "$c" ] && [ "$c" = "$g" ]; then say "CLI dummy kernel: equal ($c)"; else ok=0; say "CLI dummy: cpu '$c' vs cuda '$g'"; fi
rm -rf "$DIR"
if [ $ok = 1 ]; then say "== all checks passed"; else say "== SOME CHECKS FAILED"; fi
