#!/usr/bin/env bash
# One device call, several GPUs, different work on each: scripts/gpu_lanes.sh "STEPS FOR GPU 0" "STEPS FOR GPU 1" ...
# Each lane runs `scripts/gpu_check.sh STEPS` pinned to its GPU, into $OUT/lI. DEADLINE_S (default 550) bounds the
# whole call: a bench step gets what is left of it as BENCH_TIMEOUT, and every lane is stopped at the deadline so
# that the results still come back. The device tool returns at most 8 files: everything under $OUT ends up in
# one archive, $OUT/lanes.tgz. BENCH_DB_DIR (e.g. a carried .benchdb) is copied into it too.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
end=$((SECONDS + ${DEADLINE_S:-550}))
bash scripts/gpu_check.sh env >"$OUT/env.log" 2>&1 || { cat "$OUT/env.log"; exit 3; }  # installs once
export KERNELLAB_SKIP_INSTALL=1
lane() {  # lane GPU STEPS...
  local gpu=$1; shift
  for step in "$@"; do
    left=$((end - SECONDS - 15))
    [ "$left" -lt 30 ] && { echo "=== $step skipped: ${left}s left"; continue; }
    CUDA_VISIBLE_DEVICES=$gpu OUT="$OUT/l$gpu" BENCH_TIMEOUT=$left timeout "$left" bash scripts/gpu_check.sh "$step"
  done
}
i=0
for steps in "$@"; do
  mkdir -p "$OUT/l$i"
  # shellcheck disable=SC2086
  lane "$i" $steps >"$OUT/l$i/lane.log" 2>&1 &
  i=$((i + 1))
done
wait
for f in "$OUT"/l*/lane.log; do echo "##### $f"; tail -n 40 "$f"; done
[ -n "${BENCH_DB_DIR:-}" ] && [ -d "$BENCH_DB_DIR" ] && cp -r "$BENCH_DB_DIR" "$OUT/benchdb"
# the archive is written outside $OUT, then moved in: tar fails ("file changed as we read it") on a folder that
# its own archive grows in
tmp=$(mktemp /tmp/lanes.XXXXXX.tgz)
(cd "$OUT" && tar czf "$tmp" . && mv "$tmp" lanes.tgz && find . -mindepth 1 ! -name lanes.tgz ! -name env.log -delete)
