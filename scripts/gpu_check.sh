#!/usr/bin/env bash
# The GPU tests and the GPU benchmarks in one call, on a CUDA host (e.g. the H200 behind the `device`
# tool). Usage: scripts/gpu_check.sh [STEP...]   STEPs: env tests (= tests-par, then tests-bigmem) tests-slow eager sandbox gemm tuning builtin scaleout
# bench:SUITE study:SUITE campaign:FILE optimize throughput (default: env tests). Logs and results go to $OUT (default ./gpu-out); result files
# are also written under experiments/results/.
#
# The GPU host is offline and lacks langgraph/optuna/sqlite-utils/anthropic: their wheels travel in
# .whl (made with ../shared/tools/gpu-wheels.sh .whl langgraph langgraph-checkpoint-sqlite optuna
# sqlite-utils anthropic openai scipy matplotlib dask distributed partd locket tblib tornado zict) and are
# installed into /tmp/site with kernellab itself. Of dask/distributed's pure-Python needs the host's torch image
# lacks dask distributed partd locket tblib tornado zict (it has cloudpickle toolz fsspec msgpack sortedcontainers
# psutil pyyaml jinja2 click packaging urllib3; dask's importlib_metadata is for Python < 3.12 only).
#
# GPU_CHECK_ONE_FILE=1: leave $OUT as one archive, out.tgz (what the device tool hands back is limited in count).
# KERNELLAB_COMMIT=<commit>: the commit the results record. Pass it on a host whose copy of the tree is not a git
# checkout of that commit (the device tool's copy keeps the session's starting commit in .git, and the results of
# every later call said that commit "+dirty"): e.g. run `KERNELLAB_COMMIT=$(git rev-parse --short=12 HEAD)` here and
# put the value in the remote command.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KERNELLAB_COMMIT:-}" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "gpu_check: the tree differs from its git HEAD and KERNELLAB_COMMIT is not set: results will name HEAD +dirty" >&2
fi
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# KernelBench for the cross-check: a copy carried in the (ignored) .kb folder, since ../shared does not travel
[ -d .kb/src/kernelbench ] && export KERNELBENCH_DIR=${KERNELBENCH_DIR:-$PWD/.kb}
PY=${PYTHON:-python3}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(env tests)

# KERNELLAB_SKIP_INSTALL=1: an earlier gpu_check.sh of this call installed already (lanes run side by side,
# one per GPU, and must not install into the site folder at the same time). KERNELLAB_SITE: that folder
# [/tmp/site] (the CPU tests of the scripts point it at an empty one: .whl's wheels are the GPU host's Python's)
SITE=${KERNELLAB_SITE:-/tmp/site}
if [ -z "${KERNELLAB_SKIP_INSTALL:-}" ]; then
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 3
  fi
  $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . || exit 3
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
# the GPUs this call may use: CUDA_VISIBLE_DEVICES where set, else every GPU of the host. The parallel tests
# spread their xdist workers over them (tests/conftest.py); a bench runs one shard per GPU.
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  IFS=, read -ra GPUS <<<"$CUDA_VISIBLE_DEVICES"
else
  mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ')
fi
[ ${#GPUS[@]} -eq 0 ] && GPUS=(0)
export KERNELLAB_TEST_GPUS=$(IFS=,; echo "${GPUS[*]}")
# every test's outcome and duration as it ends, with the failures' tracebacks (tests/conftest.py)
export KERNELLAB_TEST_REPORT=${KERNELLAB_TEST_REPORT:-$OUT/test-report.txt}
# KERNELLAB_TESTS_DONE=FILE (an earlier call's test-report.txt, carried back in the working tree) leaves out the tests
# it says passed: a suite longer than one call goes on where the last one stopped
# TESTS narrows the tests steps to some files or node ids (default: all of tests/)
read -ra TESTS <<<"${TESTS:-tests}"
rc=0
# gpu_pytest LOG MARKS PYTEST-ARGS...: the tests of MARKS (narrowed by TESTS) into $OUT/LOG, its summary lines
# printed; -v so that a run cut off by the call's limit still says which tests passed
gpu_pytest() {
  local log=$1 marks=$2; shift 2
  $PY -m pytest -v -m "$marks" -p no:cacheprovider -o addopts="" -rfEs "$@" "${TESTS[@]}" >"$OUT/$log" 2>&1
  rc=$((rc | $?))
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$log" | tail -n 40
}
for step in "${steps[@]}"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case "$step" in
    env)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
      $PY -c "import kernellab.env as e, json; print(json.dumps(e.versions())); print(e.device_name())"
      (command -v ncu && ncu --version | tail -1) || echo "ncu: not on PATH" ;;
    tests|tests-par|tests-bigmem)
      # tests-par: xdist workers spread over the GPUs, each worker's sandbox with 1/N of its card
      # (tests/conftest.py); --dist loadgroup keeps the adversarial file, whose fixture submits all its
      # candidates at once, on one worker
      [ "$step" != tests-bigmem ] && gpu_pytest gpu-tests.log "gpu and not bigmem and not gpu_slow" \
        -n "${GPU_TEST_WORKERS:-6}" --dist loadgroup --durations=15
      # tests-bigmem: one worker per GPU, each with its whole card
      bm=(); [ ${#GPUS[@]} -gt 1 ] && bm=(-n "${#GPUS[@]}")
      [ "$step" != tests-par ] && gpu_pytest gpu-tests-bigmem.log "gpu and bigmem and not gpu_slow" --durations=8 "${bm[@]}" ;;
    tests-slow)  # the long cases left out of `tests`: the rest of each full-size sweep, every bundled seed at full size;
      # its bigmem cases after the others, alone on each card
      gpu_pytest gpu-tests-slow.log "gpu and gpu_slow and not bigmem" -n "${GPU_TEST_WORKERS:-6}" --durations=10
      bm=(); [ ${#GPUS[@]} -gt 1 ] && bm=(-n "${#GPUS[@]}")
      gpu_pytest gpu-tests-slow-bigmem.log "gpu and gpu_slow and bigmem" --durations=8 "${bm[@]}" ;;
    eager)   $PY experiments/measure_eager.py 2>&1 | tee "$OUT/eager.log" ;;
    sandbox) $PY experiments/bench_sandbox.py 2>&1 | tee "$OUT/sandbox.log" ;;
    gemm)    $PY experiments/bench_gemm_templates.py 2>&1 | tee "$OUT/gemm.log" ;;
    tuning)  $PY experiments/bench_tuning.py 2>&1 | tee "$OUT/tuning.log" ;;
    builtin) $PY experiments/bench_builtin.py 2>&1 | tee "$OUT/builtin.log" ;;
    bench:*) # BENCH_ARGS e.g. "--budget 4 --jobs 8"; BENCH_TIMEOUT bounds it so the results still come back.
      # One shard per GPU, each into its own database under BENCH_DB_DIR (default $OUT); carry that folder to
      # the next call and the bench goes on where it stopped (`kernellab bench` skips finished problems).
      suite=${step#bench:}; dbdir=${BENCH_DB_DIR:-$OUT}; mkdir -p "$dbdir"; n=${#GPUS[@]}
      if [ "$n" -gt 1 ]; then
        for i in "${!GPUS[@]}"; do
          CUDA_VISIBLE_DEVICES=${GPUS[$i]} timeout "${BENCH_TIMEOUT:-3000}" $PY -m kernellab.cli bench "$suite" \
            --db "$dbdir/bench-shard${i}of$n.db" --shard "$i/$n" ${BENCH_ARGS:-} >"$OUT/bench-shard${i}of$n.log" 2>&1 &
        done
        wait
        tail -n 25 "$OUT"/bench-shard*of$n.log
      else
        timeout "${BENCH_TIMEOUT:-3000}" $PY -m kernellab.cli bench "$suite" --db "$dbdir/bench.db" ${BENCH_ARGS:-} 2>&1 \
          | tee "$OUT/bench.log"
      fi ;;
    study:*) # the strategy study (docs/guide.md "Studying search strategies"): STUDY_ARGS e.g. "--policy greedy,beam,uct,evolve
      # --seeds 2 --budget 16 --jobs 4"; the database of the last call (STUDY_DB, or STUDY_DB.gz placed in the
      # working tree, where it travels as an untracked file) makes it resume where that call stopped; SIGINT at
      # STUDY_TIMEOUT, SIGKILL 60 s later (a killed campaign resumes); the database comes back gzipped in $OUT
      db=${STUDY_DB:-study.db}
      [ -f "$db" ] || { [ -f "$db.gz" ] && gunzip -k "$db.gz"; }
      timeout -s INT -k 60 "${STUDY_TIMEOUT:-520}" $PY -m kernellab.cli study "${step#study:}" --db "$db" \
        --name "${STUDY_NAME:-policies}" ${STUDY_ARGS:-} 2>&1 | tee "$OUT/study.log"
      $PY -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" "$db" "$OUT/$(basename "$db")" \
        && gzip -f "$OUT/$(basename "$db")"
      if $PY -c "import scipy, matplotlib" 2>/dev/null; then
        $PY -m kernellab.cli compare --study "${STUDY_NAME:-policies}" --db "$db" -o "$OUT/study.html" --json \
          > "$OUT/study.json" 2>>"$OUT/study.log"
      fi ;;
    campaign:*) # one campaign on one problem file, then where its time went (experiments/campaign_steps.py);
      # CAMPAIGN_ARGS e.g. "--budget 4 --width 2" (default); SIGINT at CAMPAIGN_TIMEOUT (default 300 s): saved
      db="$OUT/campaign.db"
      timeout -s INT -k 30 "${CAMPAIGN_TIMEOUT:-300}" $PY -m kernellab.cli run "${step#campaign:}" --db "$db" \
        --campaign steps ${CAMPAIGN_ARGS:---budget 4 --width 2} 2>&1 | tee "$OUT/campaign.log"
      $PY experiments/campaign_steps.py steps --db "$db" 2>&1 | tee -a "$OUT/campaign.log" ;;
    optimize)  # whole models (kernellab optimize): five level-3 models, then a timm ResNet-18 and a transformers
      # BERT-base (experiments/models/library.py; the host's own timm and transformers, no wheel travels);
      # OPTIMIZE_ARGS e.g. "--budget 12 --time-budget 120" or "--models experiments.models.library:hf_bert".
      # Results are written after each model; OPTIMIZE_KEEP=FILE (an earlier call's JSON, carried back in the tree)
      # keeps its models' rows, so the seven models can span calls. The database (OPTIMIZE_DB) stays out of $OUT:
      # too big to come back.
      keep=(); [ -n "${OPTIMIZE_KEEP:-}" ] && keep=(--keep "$OPTIMIZE_KEEP")
      $PY experiments/bench_optimize.py --db "${OPTIMIZE_DB:-/tmp/kernellab-optimize.db}" --out-dir "$OUT" "${keep[@]}" \
        ${OPTIMIZE_ARGS:-} 2>&1 | tee "$OUT/optimize.log" ;;
    throughput) # experiments/bench_throughput.py: this tree against a base commit, side by side, one after the other;
      # THROUGHPUT_ARGS e.g. "--problems 6 --side-limit-s 240" (both sides within the call) or "--sides new"; KernelBench
      # from KERNELBENCH_DIR (the carried .kb). The page and both sides' gzipped databases go to $OUT
      $PY experiments/bench_throughput.py --out "$OUT" ${THROUGHPUT_ARGS:-} 2>&1 | tee "$OUT/throughput.log" ;;
    scaleout) # one GPU vs all with the local executor vs a Dask cluster (needs dask/distributed wheels in .whl)
      $PY experiments/bench_scaleout.py ${SCALEOUT_ARGS:-} 2>&1 | tee "$OUT/scaleout.log" ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
done
# what comes back from a remote host is limited in file count: one archive of all results. Not after `env` alone,
# which writes none: the 7 MB copy of what is already in the tree sent kb_public.sh's output over the size limit
# (session 21, call 2: its database stayed behind)
[ "${steps[*]}" = env ] || tar czf "$OUT/results.tgz" experiments/results 2>/dev/null || true
# GPU_CHECK_ONE_FILE=1: $OUT ends as one archive, out.tgz, of everything the steps wrote there (the device tool
# hands back only so many files: session 7's tuning JSON was the ninth and stayed behind)
if [ -n "${GPU_CHECK_ONE_FILE:-}" ]; then
  (cd "$OUT" && tar czf ../gpu-check-out.tgz . && find . -mindepth 1 -delete && mv ../gpu-check-out.tgz out.tgz)
fi
exit $rc
