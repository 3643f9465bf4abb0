#!/usr/bin/env bash
# Side-by-side load benchmark: our strategies, the Python peers and the
# machine's limits, on one synthesized checkpoint, hot and cold page cache.
#   bench/compare/run.sh [MODEL_DIR] [SIZE]     (defaults: /tmp/wl_bench/model 2GB)
# Env: REPS (round-robin passes, best run per row kept; default 2), OUT (results dir, default
# bench/compare/out), SKIP_PEERS=1, SKIP_COLD=1.
# Writes $OUT/results.jsonl, docs/bench_compare.md and docs/bench_compare.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-/tmp/wl_bench/model}
SIZE=${2:-2GB}
REPS=${REPS:-2}
OUT=${OUT:-bench/compare/out}
WL=build/bin/weightlift
PY=.venv/bin/python
mkdir -p "$OUT"
RES="$OUT/results.jsonl"
: > "$RES"

[ -x "$WL" ] || { cmake -S . -B build -G Ninja -DWEIGHTLIFT_BUILD_BENCH=OFF >/dev/null && ninja -C build weightlift_cli; }
[ -x "$PY" ] || scripts/setup
"$PY" -m pip install -q -r bench/compare/requirements.txt
"$PY" -m pip install -q --no-deps -r bench/compare/requirements-nodeps.txt || echo "run.sh: peers without deps failed to install" >&2
c++ -O2 -std=c++20 -pthread -o "$OUT/limits" bench/compare/limits.cpp

[ -f "$MODEL/model.safetensors.index.json" ] || "$WL" synth "$MODEL" --size "$SIZE"
FILES=("$MODEL"/*.safetensors)
BIN="$MODEL-bin/pytorch_model.bin"   # the same tensors for torch.load
if [ ! -f "$BIN" ] && [ "${SKIP_PEERS:-0}" != 1 ]; then
  mkdir -p "$(dirname "$BIN")"
  "$PY" - "$MODEL" "$BIN" <<'PYEOF'
import glob, sys, torch
from safetensors.torch import load_file
sd = {}
for f in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    sd.update(load_file(f))
torch.save(sd, sys.argv[2] + ".tmp")
import os; os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PYEOF
fi

drop_caches() {
  sync
  if ! (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
    # Not permitted: evict just our files.
    "$PY" -c 'import os,sys
for p in sys.argv[1:]:
    fd=os.open(p,os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)' "${FILES[@]}" "$BIN" 2>/dev/null || true
  fi
}
warm() { cat "${FILES[@]}" > /dev/null; [ -f "$BIN" ] && cat "$BIN" > /dev/null || true; }

emit() { echo "$1" >> "$RES"; echo "$1"; }

# One measurement: cache mode, kind, name, command printing either our
# summary line or a peer's / limit's JSON. Rows are measured round-robin
# (every row once per pass, REPS passes) so that noise from other processes
# spreads over all rows; report.py keeps each row's best run.
row() {
  local cache=$1 kind=$2 name=$3; shift 3
  [ "$cache" = cold ] && drop_caches
  local out
  if ! out=$("$@" 2>&1); then
    echo "run.sh: $name ($cache) failed: $(echo "$out" | tail -3)" >&2
    emit "{\"cache\":\"$cache\",\"kind\":\"$kind\",\"name\":\"$name\",\"error\":$(echo "$out" | tail -1 | "$PY" -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))')}"
    return 0
  fi
  local j
  j=$(echo "$out" | "$PY" bench/compare/parse.py "$cache" "$kind" "$name") || { echo "run.sh: cannot parse $name: $out" >&2; return 0; }
  emit "$j"
}

for ((rep = 0; rep < REPS; rep++)); do
  for cache in hot cold; do
    [ "$cache" = cold ] && [ "${SKIP_COLD:-0}" = 1 ] && continue
    if [ "$cache" = hot ]; then
      # Warm the cache once per pass, then one untimed load: the first 2 GB
      # allocation after `cat` filled memory with page cache pays for direct
      # reclaim (seconds of system time), whichever loader comes first.
      # The memcpy limit goes first: its 2 GiB of buffers evict page cache.
      row hot limit "memcpy (1 thread)" "$OUT/limits" memcpy
      warm
      "$WL" load "$MODEL" --strategy eager --no-progress >/dev/null 2>&1 || true
    else
      row cold limit "O_DIRECT read (1 thread)" "$OUT/limits" odirect 1 "${FILES[@]}"
      row cold limit "O_DIRECT read (4 threads)" "$OUT/limits" odirect 4 "${FILES[@]}"
    fi
    for s in stream threads eager lazy prefetch auto; do
      row "$cache" ours "weightlift $s" "$WL" load "$MODEL" --strategy "$s" --no-progress
    done
    [ "$cache" = cold ] && row cold ours "weightlift stream --direct off" "$WL" load "$MODEL" --strategy stream --direct off --no-progress
    if [ "${SKIP_PEERS:-0}" != 1 ]; then
      row "$cache" peer "safetensors" "$PY" bench/compare/peers.py safetensors "$MODEL"
      row "$cache" peer "runai-model-streamer" "$PY" bench/compare/peers.py runai-model-streamer "$MODEL"
      row "$cache" peer "fastsafetensors" "$PY" bench/compare/peers.py fastsafetensors "$MODEL"
      [ -f "$BIN" ] && row "$cache" peer "torch.load (.bin)" "$PY" bench/compare/peers.py torch.load "$BIN"
    fi
  done
done
DOCS=${DOCS:-docs}
mkdir -p "$DOCS"
"$PY" bench/compare/report.py "$RES" "$DOCS/bench_compare.md" "$DOCS/bench_compare.png"
