#!/usr/bin/env bash
# The throughput probe of session 11 (a diagnosis, not the benchmark: see experiments/bench_throughput.py):
# a solo `kernellab run` of level2/76 at budget 4, then a 4-job bench of the four problems of the evidence
# (../shared/evidence/throughput-2026-12-02.md), with nvidia-smi samples and py-spy dumps. KernelBench in .kb.
set -u
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 > $OUT/util.csv &
SMI=$!
t0=$(date +%s.%N)
python3 -m kernellab.cli run .kb/level2/76_Gemm_Add_ReLU.py --budget 4 --db /tmp/solo.db > $OUT/solo.log 2>&1
t1=$(date +%s.%N)
python3 -c "print('SOLO WALL', round($t1 - $t0, 1), 's')"
mkdir -p /tmp/cprob
cp .kb/level1/23_Softmax.py .kb/level1/1_Square_matrix_multiplication_.py .kb/level2/76_Gemm_Add_ReLU.py .kb/level2/57_Conv2d_ReLU_HardSwish.py /tmp/cprob/
t2=$(date +%s.%N)
python3 -m kernellab.cli bench /tmp/cprob --db /tmp/c.db --out-dir /tmp/cw --jobs 4 --budget 4 > $OUT/bench.log 2>&1 &
B=$!
(sleep 60; py-spy dump --pid $B > $OUT/pyspy.txt 2>&1; sleep 60; py-spy dump --pid $B >> $OUT/pyspy.txt 2>&1) &
timeout 330 tail --pid=$B -f /dev/null
kill -INT $B 2>/dev/null; sleep 12; kill -9 $B 2>/dev/null
t3=$(date +%s.%N)
python3 -c "print('BENCH WALL', round($t3 - $t2, 1), 's')"
kill $SMI
python3 experiments/probes/throughput_probe_summary.py /tmp/solo.db /tmp/c.db $OUT/util.csv $t0 $t1 $t2 $t3 > $OUT/summary.txt 2>&1
cat $OUT/summary.txt
tail -5 $OUT/bench.log
gzip -c /tmp/c.db > $OUT/bench-db.gz; gzip -c /tmp/solo.db > $OUT/solo-db.gz
