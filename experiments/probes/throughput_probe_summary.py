"""Summary of experiments/probes/throughput_probe.sh: GPU utilisation per window, each campaign's steps, the
evaluations' phases, reused references and admission waits."""
import json, sqlite3, sys, statistics
from kernellab.store import Store
from kernellab.campaign import step_times, format_step_times
solo, bench, util, t0, t1, t2, t3 = sys.argv[1:8]
t0, t1, t2, t3 = map(float, (t0, t1, t2, t3))
rows = []
for line in open(util):
    p = [x.strip() for x in line.split(",")]
    if len(p) < 3: continue
    import datetime as dt
    try:
        ts = dt.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc).timestamp()
    except ValueError:
        continue
    rows.append((ts, float(p[1]), float(p[2])))
def win(a, b):
    xs = [r for r in rows if a <= r[0] <= b]
    if not xs: return "no samples"
    return f"{len(xs)} samples, util mean {statistics.mean(r[1] for r in xs):.1f}%, >0 {sum(r[1]>0 for r in xs)/len(xs):.0%}, mem max {max(r[2] for r in xs):.0f} MiB"
print("SOLO util:", win(t0, t1)); print("BENCH util:", win(t2, t3))
for db in (solo, bench):
    print("=====", db)
    s = Store(db)
    con = sqlite3.connect(db)
    for cid, name, status, created in con.execute("select id, name, status, created_at from campaigns"):
        print("--", name, status)
        try: print(format_step_times(step_times(s, cid)))
        except Exception as e: print("steps:", e)
    ph = {}; n = 0; reused = 0; adm = 0.0; kinds = {}
    for kind, status, det in con.execute("select e.kind, e.status, e.details_json from evaluations e"):
        kinds[(kind, status)] = kinds.get((kind, status), 0) + 1
        d = json.loads(det or "{}")
        n += 1
        for k, v in (d.get("phase_s") or {}).items(): ph[k] = ph.get(k, 0) + v
        reused += bool((d.get("reference") or {}).get("reused"))
        adm += ((d.get("memory") or {}).get("admission_wait_s") or 0)
    print("evaluations", n, "reused refs", reused, "admission wait", round(adm, 1), kinds)
    print("phases:", {k: round(v, 1) for k, v in sorted(ph.items(), key=lambda kv: -kv[1])})
