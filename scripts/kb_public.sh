#!/usr/bin/env bash
# Issue 31's public-suite run (KernelBench level 1 and 2 at budget 4), one device call of many.
#   KB_DB_GZ=experiments/results/<...>.db.gz  the last call's database, carried in the tree: the bench resumes it
#   KB_TIMEOUT=S   SIGINT to the bench at S seconds (it saves and stops), SIGKILL 30 s later [420]; 0: no bench
#                  (with KB_CROSSCHECK: the cross-check of the database alone)
#   KB_JOBS=N      campaigns at once [8]     KB_SUITE   [.kb/level[12]/*.py]
#   KB_WARM_DB=1   resume /tmp/kb-public.db where an earlier call on this still-warm machine left it
#   KB_RERUN="A B" problems run again under the current code although finished (`kernellab bench --rerun`)
#   KB_HOST_FLOOR_GB=G  stop the bench / cross-check when the host has less than G GB available [half the sandbox's floor]
#   SOLO=FILE      first, one timed `kernellab run FILE --budget 4` and where its time went
#   KB_CROSSCHECK=S  then experiments/kb_crosscheck.py on the database for at most S seconds; KB_KEEP=JSON (an
#                  earlier cross-check's, in the tree) keeps its verdicts of the same evaluations;
#                  KB_CROSSCHECK_JOBS=N KernelBench runs at once, taking turns on the GPU [1]
# The database comes back gzipped in $OUT (kb-public.db.gz), with the bench's pages and log. The bench and the
# cross-check run under experiments/host_watch.py: stopped before the host runs out of memory, which would lose the
# whole call ("host_watch: host memory: ..." in the log where it fired).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
bash scripts/gpu_check.sh env || exit 3
export PYTHONPATH=${KERNELLAB_SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KERNELBENCH_DIR=$PWD/.kb
PY=${PYTHON:-python3}
if [ -n "${SOLO:-}" ]; then
  t0=$(date +%s%N)
  # each line stamped with the seconds since the start: the exit's share shows after the last line
  $PY -m kernellab.cli run "$SOLO" --budget 4 --db "$OUT/solo.db" --campaign solo 2>&1 | T0=$t0 $PY -u -c '
import os, sys, time
t0 = int(os.environ["T0"]) / 1e9
for line in sys.stdin:
    sys.stdout.write(f"{time.time() - t0:7.2f} {line}")' > "$OUT/solo.log"
  src=${PIPESTATUS[0]}
  t1=$(date +%s%N)
  echo "solo: $SOLO --budget 4: rc $src, wall $(( (t1 - t0) / 1000000 )) ms" | tee -a "$OUT/solo.log"
  tail -n 8 "$OUT/solo.log"
  $PY experiments/campaign_steps.py solo --db "$OUT/solo.db" 2>&1 | tee -a "$OUT/solo.log"
  gzip -f "$OUT/solo.db"
fi
[ "${KB_TIMEOUT:-420}" = 0 ] && [ -z "${KB_CROSSCHECK:-}" ] && exit 0  # the solo run alone
db=/tmp/kb-public.db
hw=(); [ -n "${KB_HOST_FLOOR_GB:-}" ] && hw=(--floor-gb "$KB_HOST_FLOOR_GB")
src=${KB_DB_GZ:-none}
# a machine still warm from the last call keeps its database there, newer than the one in the tree
if [ -n "${KB_WARM_DB:-}" ] && [ -s "$db" ]; then
  src="$db (left by the last call on this machine)"
else
  rm -f "$db"
  [ -n "${KB_DB_GZ:-}" ] && [ -f "$KB_DB_GZ" ] && gunzip -c "$KB_DB_GZ" > "$db"
fi
if [ "${KB_TIMEOUT:-420}" != 0 ]; then  # 0 with KB_CROSSCHECK: the cross-check alone, of the database as it is
echo "kb_public: bench start $(date -u +%H:%M:%S), resuming: $src"
rerun=(); for p in ${KB_RERUN:-}; do rerun+=(--rerun "$p"); done
timeout -s INT -k 30 "${KB_TIMEOUT:-420}" $PY experiments/host_watch.py "${hw[@]}" -- $PY -m kernellab.cli bench "${KB_SUITE:-.kb/level[12]/*.py}" --budget 4 \
  --jobs "${KB_JOBS:-8}" --db "$db" --name kb-public --out-dir "$OUT" "${rerun[@]}" > "$OUT/kb-bench.log" 2>&1
echo "kb_public: bench rc $? at $(date -u +%H:%M:%S)"  # 124/130: stopped at KB_TIMEOUT, saved
tail -n 30 "$OUT/kb-bench.log"
$PY -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" "$db" "$OUT/kb-public.db" \
  && gzip -f "$OUT/kb-public.db"
# memory admission by problem over the whole database (longest waits first): need, allocated and reserved peaks
$PY -c "
import json, sqlite3, sys
sys.path.insert(0, 'experiments')
import bench_throughput as bt
for r in bt.memory_by_problem(sqlite3.connect(sys.argv[1]))[:15]:
    print(json.dumps(r))" "$db" > "$OUT/memory-by-problem.jsonl" 2>&1 || true
fi
if [ -n "${KB_CROSSCHECK:-}" ]; then
  keep=(); [ -n "${KB_KEEP:-}" ] && keep=(--keep "$KB_KEEP")
  timeout -s INT "$KB_CROSSCHECK" $PY experiments/host_watch.py "${hw[@]}" -- $PY experiments/kb_crosscheck.py --db "$db" --kernelbench "$PWD/.kb" --out-dir "$OUT" \
    --jobs "${KB_CROSSCHECK_JOBS:-1}" "${keep[@]}" 2>&1 | tail -n 40  # enough for a traceback's head (session 34 lost one at 12)
fi
