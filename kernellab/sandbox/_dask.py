"""An executor on Dask distributed: the same ``submit``/``shutdown`` as :class:`LocalExecutor`, over the GPUs
of many hosts.

Roles. The campaign process is the coordinator: it submits jobs and is the only writer of the SQLite store.
Each Dask worker owns one GPU (worker resource ``GPU=1``, ``CUDA_VISIBLE_DEVICES`` pinned before it starts)
or, on a CPU-only machine, runs the Triton interpreter. A worker plugin (:class:`KernellabPlugin`) keeps one
:class:`LocalExecutor` inside each Dask worker; a Dask task hands its job to that executor, which runs it in
kernellab's own sandbox worker processes -- candidate code never runs in the Dask worker itself, and the
per-GPU reader/writer lock (timing exclusivity) and the memory admission live in the one Dask worker that
owns the GPU, so they hold across the cluster exactly as on one host.

Jobs and results travel as plain data: the job as a dict (the problem as name/source/path, the limits as a
dict), the result as the JSON-decoded evaluation dict. Nothing of the store travels: the coordinator sends
the cached torch.compile baselines of the job's problem with it, and a baseline measured on a worker comes
back in the result (``details._baseline_puts``) and is written by the coordinator.

Lost workers. A Dask worker that dies mid-job (its process killed, its host gone) has its task run again on
another worker, or on the same one once its nanny has restarted it, by the scheduler
(``distributed.scheduler.allowed-failures``); the coordinator sees one result per job id and sets its future
once, so the campaign writes that evaluation once. A job whose workers kept dying comes back as an
infrastructure result (``sandbox``), never as the candidate's verdict. No wait on the cluster is unbounded:
a task whose kind of worker is gone (killed with no nanny to restart it, its host lost, the scheduler
unreachable) would sit in the scheduler's ``no-worker`` state for ever, so the coordinator watches the
cluster and answers every job of that kind, after ``worker_wait_s`` without such a worker, with the
infrastructure result ``worker_start`` (``details.breaker``: the campaign stops, saved, and a resumed one
evaluates the candidate again); a job submitted while none is there gets the same answer.

    kernellab worker --scheduler tcp://HOST:8786          # one per GPU of each GPU host
    kernellab bench SUITE --cluster tcp://HOST:8786       # the coordinator
    kernellab bench SUITE --cluster local                 # a cluster in-process: one worker per local GPU

This module imports ``distributed``; nothing else of kernellab imports it (the CLI does, for ``--cluster`` and
``worker`` only), so kernellab runs without Dask installed.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import json
import os
import threading
import time
import uuid
from dataclasses import asdict, replace
from typing import Any

from distributed import WorkerPlugin

from kernellab import _runtime
from kernellab.problem import Problem
from kernellab.vocab import small_for

from ._executor import EvalJob, Executor, Limits, LocalExecutor, SandboxError, _visible_gpus, check_job
from ._result import infra_result

__all__ = ["DaskExecutor", "KernellabPlugin", "start_worker", "GPU_SLOT", "CPU_SLOT"]

# Dask worker resources. ``GPU`` marks a worker that owns one GPU; the slot resources say how many jobs it runs
# at once (its LocalExecutor's workers: loading, compiling and checking overlap, the timing stays exclusive).
GPU_SLOT = "kernellab-gpu-slot"
CPU_SLOT = "kernellab-cpu-slot"
PLUGIN = "kernellab-executor"
# how long a job waits for a worker of its kind (a worker restarting after a crash, a cluster starting) before it
# is answered as an infrastructure failure; the coordinator looks at the cluster every WATCH_S while jobs are out
WORKER_WAIT_S = 120.0
WATCH_S = 1.0


def _problem_data(p: Problem) -> dict:
    return {"name": p.name, "source": p.source, "path": p.path,
            "artifacts": {k: base64.b64encode(v).decode() for k, v in (p.artifacts or {}).items()}}


def _problem_of(d: dict) -> Problem:
    return Problem(name=d["name"], source=d["source"], path=d.get("path"),
                   artifacts={k: base64.b64decode(v) for k, v in (d.get("artifacts") or {}).items()})


def job_data(job: EvalJob, job_id: str, baselines: dict[str, dict] | None = None) -> dict:
    """``job`` as plain data (what travels to a worker); ``baselines``: cached rows, key -> row."""
    return {"job_id": job_id, "problem": _problem_data(job.problem), "source": job.source, "config": job.config,
            "small": job.small, "device": job.device, "trials": job.trials, "timing": job.timing,
            "limits": asdict(job.limits) if job.limits else None, "timing_target_ms": job.timing_target_ms,
            "stop_above_ms": job.stop_above_ms, "retime": job.retime, "baselines": baselines or {}}


class _BaselineCache:
    """What a remote job sees as its ``store``: the coordinator's cached baselines of its problem, and a record
    of the ones measured here, which go back with the result for the coordinator to write."""

    def __init__(self, rows: dict[str, dict]) -> None:
        self.rows = dict(rows)
        self.puts: list[tuple[str, dict]] = []

    def get_baseline(self, key: str) -> dict | None:
        return self.rows.get(key)

    def put_baseline(self, key: str, row: dict) -> None:
        self.rows[key] = row
        self.puts.append((key, row))


def _plain(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def run_job_data(data: dict, executor: LocalExecutor) -> dict:
    """Run one job given as plain data on ``executor`` (the Dask worker's own); the result as plain data."""
    cache = _BaselineCache(data.get("baselines") or {})
    job = EvalJob(problem=_problem_of(data["problem"]), source=data["source"], config=data.get("config"),
                  small=data.get("small"), device=data.get("device"), trials=int(data.get("trials", 5)),
                  timing=bool(data.get("timing", True)), store=cache,
                  limits=Limits(**data["limits"]) if data.get("limits") else None,
                  timing_target_ms=data.get("timing_target_ms"), stop_above_ms=data.get("stop_above_ms"),
                  retime=bool(data.get("retime")))
    result = executor.submit(job).result()
    result = _plain(result)
    details = result.setdefault("details", {})
    details["_baseline_puts"] = [[k, _plain(r)] for k, r in cache.puts]
    details["job_id"] = data["job_id"]
    return result


# -- the Dask worker's side -----------------------------------------------------------------------------------
class KernellabPlugin(WorkerPlugin):
    """A Dask worker plugin: one :class:`LocalExecutor` per Dask worker (its sandbox workers on the worker's one
    GPU, or on the CPU), started with the worker and stopped with it. Registered by :class:`DaskExecutor`, so a
    worker that joins later (or restarts after a crash) gets one too."""

    name = PLUGIN
    idempotent = True

    def __init__(self, slots: int = 1, gpu_bytes: int | None = None, max_jobs_per_worker: int = 50,
                 cpu_memory_gb: float | None = 8.0) -> None:
        self.slots, self.gpu_bytes = slots, gpu_bytes
        self.max_jobs_per_worker, self.cpu_memory_gb = max_jobs_per_worker, cpu_memory_gb

    def setup(self, worker: Any) -> None:
        _runtime.setup()  # the Dask worker's start: the interpreter switch and the ast lock (kernellab._runtime)
        # the worker's own slot resource is the number of jobs it is sent at once: its pool matches it
        res = getattr(worker.state, "total_resources", None) or getattr(worker, "total_resources", {}) or {}
        n = int(res.get(GPU_SLOT) or res.get(CPU_SLOT) or self.slots)
        worker.kernellab_executor = LocalExecutor(workers_per_gpu=n, cpu_workers=n, gpu_bytes=self.gpu_bytes,
                                                  max_jobs_per_worker=self.max_jobs_per_worker,
                                                  cpu_memory_gb=self.cpu_memory_gb)

    def teardown(self, worker: Any) -> None:
        ex = getattr(worker, "kernellab_executor", None)
        if ex is not None:
            ex.shutdown(wait=False)


def _remote(data: dict) -> dict:
    """The Dask task: the job runs in this worker's sandbox processes, never in this process."""
    from distributed import get_worker

    worker = get_worker()
    ex = getattr(worker, "kernellab_executor", None)
    if ex is None:  # the plugin's setup failed or has not run: the job cannot run here
        raise RuntimeError(f"Dask worker {worker.address} has no kernellab executor (plugin {PLUGIN!r} missing)")
    result = run_job_data(data, ex)
    result["details"]["dask_worker"] = worker.address
    return result


def _worker_pid() -> int:
    return os.getpid()


def worker_resources(gpu: bool, slots: int) -> dict[str, float]:
    return {"GPU": 1, GPU_SLOT: slots} if gpu else {CPU_SLOT: slots}


def start_worker(scheduler: str, *, gpu: str | None = None, slots: int = 1, name: str | None = None,
                 nanny: bool = True) -> None:
    """``kernellab worker``: run one Dask worker (under a nanny, which restarts it after a crash) that owns GPU
    ``gpu`` (``CUDA_VISIBLE_DEVICES`` pinned to it; None: the one visible GPU, or the CPU when none is), until
    it is stopped. One per GPU of a host."""
    import asyncio

    from distributed import Nanny, Worker

    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    gpus = _visible_gpus()
    if len(gpus) > 1:
        raise SandboxError(f"this worker would see {len(gpus)} GPUs ({', '.join(gpus)}): start one worker per GPU "
                           "with --gpu ID (or set CUDA_VISIBLE_DEVICES)")
    env = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")} if gpus else {}
    opts = dict(nthreads=slots, resources=worker_resources(bool(gpus), slots), name=name)

    async def main() -> None:
        cls = Nanny if nanny else Worker
        kw = {"env": env} if nanny else {}
        async with cls(scheduler, **opts, **kw) as w:
            await w.finished()

    asyncio.run(main())


# -- the coordinator's side -----------------------------------------------------------------------------------
def _local_cluster(n_workers: int | None, slots: int) -> Any:
    """A cluster in this process: one worker (a process of its own, under a nanny) per local GPU, each pinned to
    it, or ``n_workers`` CPU workers (default 2) running the interpreter."""
    import logging

    from distributed import Nanny, Scheduler, SpecCluster

    # a cluster inside a command: its INFO lines (every start and stop) would drown the command's output;
    # the workers are new processes and read the variable, this process's loggers are set directly
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    gpus = _visible_gpus()
    if gpus:
        if n_workers is not None and n_workers != len(gpus):
            raise SandboxError(f"--cluster local:{n_workers}: this host has {len(gpus)} GPUs, and a worker owns one")
        places: list[str | None] = list(gpus)
    else:
        places = [None] * (n_workers or 2)
    workers = {}
    for i, g in enumerate(places):
        env = {"CUDA_VISIBLE_DEVICES": g} if g is not None else {"CUDA_VISIBLE_DEVICES": ""}
        workers[f"kernellab-{'gpu' + g if g is not None else 'cpu' + str(i)}"] = {
            "cls": Nanny, "options": {"nthreads": slots, "resources": worker_resources(g is not None, slots),
                                      "env": env, "memory_limit": 0}}
    scheduler = {"cls": Scheduler, "options": {"dashboard": False, "host": "127.0.0.1"}}
    return SpecCluster(workers=workers, scheduler=scheduler, name="kernellab")


def parse_cluster(text: str) -> tuple[str, int | None]:
    """``local``, ``local:N`` or a scheduler address -> (address or "local", N)."""
    if text == "local" or text.startswith("local:"):
        n = None
        if text != "local":
            try:
                n = int(text.split(":", 1)[1])
            except ValueError:
                n = 0
            if n < 1:
                raise SandboxError(f"--cluster {text!r}: local:N needs N >= 1 workers")
        return "local", n
    if "://" not in text:
        raise SandboxError(f"--cluster {text!r}: expected local, local:N or a scheduler address like tcp://HOST:8786")
    return text, None


class _Absence:
    """How long something (a worker of one kind) has been missing, looked at from time to time: the one clock
    behind both the jobs' bound (``_watch``) and a direct wait's (``_wait``)."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.since: float | None = None

    def over(self, missing: bool) -> float | None:
        """Record one look; the seconds missing once they reach the limit (the clock then starts again)."""
        if not missing:
            self.since = None
            return None
        now = time.monotonic()
        if self.since is None:
            self.since = now
        waited = now - self.since
        if waited < self.limit_s:
            return None
        self.since = None
        return waited


class DaskExecutor(Executor):
    """Jobs on a Dask cluster (see the module docstring). ``cluster``: ``"local"``/``"local:N"`` (a cluster in
    this process, closed with the executor) or a scheduler address (``tcp://HOST:8786``, left running).
    ``slots``: jobs per worker at once, for a local cluster (a remote worker's come from ``kernellab worker
    --slots``). ``progress``: a :class:`kernellab.progress.Progress` shown the cluster's workers, GPUs and jobs in
    flight. ``timeout``: seconds to reach the scheduler (default: Dask's ``distributed.comm.timeouts.connect``).
    ``worker_wait_s``: how long a job waits while the cluster has no worker of its kind before it is answered
    as an infrastructure failure (``worker_start``, a breaker: see the module docstring).
    """

    def __init__(self, cluster: str = "local", *, slots: int = 1, limits: Limits | None = None,
                 gpu_bytes: int | None = None, progress: Any = None, timeout: float | None = None,
                 worker_wait_s: float = WORKER_WAIT_S) -> None:
        from distributed import Client

        address, n = parse_cluster(cluster)
        if slots < 1:
            raise SandboxError(f"slots must be at least 1, got {slots}")
        if not worker_wait_s > 0:
            raise SandboxError(f"worker_wait_s must be a positive number of seconds, got {worker_wait_s!r}")
        self.worker_wait_s = float(worker_wait_s)
        self.limits = limits or Limits()
        self.progress = progress
        self._cluster = _local_cluster(n, slots) if address == "local" else None
        try:
            kw = {"timeout": timeout} if timeout is not None else {}
            self.client = Client(self._cluster if self._cluster is not None else address, set_as_default=False, **kw)
        except OSError as exc:
            if self._cluster is not None:
                self._cluster.close()
            raise SandboxError(f"no Dask scheduler reachable at {address}: {exc}") from None
        self.client.register_plugin(KernellabPlugin(slots=slots, gpu_bytes=gpu_bytes), name=PLUGIN)
        self._lock = threading.Lock()
        # job id -> (Dask future, the caller's future, the job, its device kind)
        self._pending: dict[str, tuple[Any, cf.Future, EvalJob, str]] = {}
        self._delivered: set[str] = set()
        self._baselines: dict[str, dict[str, dict]] = {}  # problem id -> key -> row (this session's)
        self._closed = False
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="kernellab-dask-watch")
        self._watcher.start()
        self._show()

    # -- the cluster -----------------------------------------------------------------------------------------
    def workers(self) -> dict[str, dict]:
        return self.client.scheduler_info().get("workers", {})

    def state(self) -> dict:
        """Workers, GPUs and jobs in flight (what the progress panel shows)."""
        ws = self.workers()
        gpus = sum(1 for w in ws.values() if (w.get("resources") or {}).get("GPU"))
        with self._lock:
            n = len(self._pending)
        return {"workers": len(ws), "gpus": gpus, "in_flight": n}

    def _show(self) -> None:
        if self.progress is None:
            return
        try:
            s = self.state()
        except Exception:  # the panel is no reason to fail a job
            return
        self.progress.update(cluster=f"{s['workers']} workers ({s['gpus']} GPUs), {s['in_flight']} jobs in flight")

    def _capable(self) -> dict[str, bool]:
        """Whether the cluster has a worker for each device kind now (none when the scheduler is unreachable:
        no job can run then either)."""
        try:
            res = [w.get("resources") or {} for w in self.workers().values()]
        except Exception:
            return {"cuda": False, "cpu": False}
        return {"cuda": any(r.get(GPU_SLOT) for r in res), "cpu": any(r.get(CPU_SLOT) for r in res)}

    def require(self, device: str | None, wait_s: float | None = None) -> str:
        """The device kind a job for ``device`` runs on: the one asked for, else CUDA when the cluster has a GPU
        worker. Waits (up to ``wait_s``, default ``worker_wait_s``) for a worker that can run it;
        :class:`SandboxError` when none came."""
        want = _wanted(device)
        deadline = time.monotonic() + (self.worker_wait_s if wait_s is None else wait_s)
        while True:
            has = self._capable()
            if want is None and (has["cuda"] or has["cpu"]):
                return "cuda" if has["cuda"] else "cpu"
            if want is not None and has[want]:
                return want
            if time.monotonic() > deadline:
                what = {"cuda": "GPU worker", "cpu": "CPU worker", None: "worker"}[want]
                raise SandboxError(f"the Dask cluster has no {what} (start one with `kernellab worker --scheduler "
                                   f"{self.client.scheduler.address}`)")
            time.sleep(0.5)

    # -- jobs ------------------------------------------------------------------------------------------------
    def submit(self, job: EvalJob) -> cf.Future:
        check_job(job, self._closed)
        _wanted(job.device)  # bad input raises; no worker is an answer
        try:
            kind = self.require(job.device)
        except SandboxError as exc:
            fut: cf.Future = cf.Future()
            fut.set_running_or_notify_cancel()
            fut.set_result(_tagged(job, infra_result(job.config, "worker_start", str(exc), breaker=True)))
            return fut
        small = small_for(kind, job.small)
        job = replace(job, device=kind, small=bool(small), limits=job.limits or self.limits)
        job_id = uuid.uuid4().hex
        data = job_data(job, job_id, self._cached_baselines(job))
        fut = cf.Future()
        fut.set_running_or_notify_cancel()
        resources = {GPU_SLOT: 1} if kind == "cuda" else {CPU_SLOT: 1}
        dfut = self.client.submit(_remote, data, key=f"kernellab-eval-{job_id}", resources=resources, pure=False,
                                  retries=1)
        with self._lock:
            self._pending[job_id] = (dfut, fut, job, kind)
        dfut.add_done_callback(lambda d: self._done(job, job_id, d))
        self._show()
        return fut

    def _cached_baselines(self, job: EvalJob) -> dict[str, dict]:
        """The baselines of the job's problem known to the coordinator: this session's, then the store's."""
        pid = job.problem.id
        with self._lock:
            rows = dict(self._baselines.get(pid, {}))
        store = job.store
        if store is not None and not job.retime:
            lister = getattr(store, "_all", None)
            if lister is not None:
                try:
                    for r in lister("select * from baselines where problem_id = ?", [pid]):
                        rows.setdefault(r["key"], {k: v for k, v in r.items() if k not in ("key", "created_at")})
                except Exception:  # the cache is an optimisation: a job without it measures its baseline
                    pass
        return _plain(rows)

    def _done(self, job: EvalJob, job_id: str, dfut: Any) -> None:
        with self._lock:
            entry = self._pending.pop(job_id, None)
            first = job_id not in self._delivered
            self._delivered.add(job_id)
        if entry is None or not first:  # delivered already (or cancelled by shutdown): once per job id
            return
        fut = entry[1]
        try:
            if dfut.status == "cancelled":
                result = infra_result(job.config, "shutdown", "the executor was shut down")
            else:
                result = dfut.result()
        except Exception as exc:  # workers kept dying under it, or a bug of ours: not the candidate's verdict
            result = infra_result(job.config, "sandbox", f"the Dask task failed: {type(exc).__name__}: {exc}")
        details = result.setdefault("details", {})
        puts = details.pop("_baseline_puts", None) or []
        if puts:  # measured by this job on its worker: the coordinator caches it for every worker
            details["baseline_cached_by_coordinator"] = True
        for key, row in puts:
            with self._lock:
                self._baselines.setdefault(job.problem.id, {})[key] = row
            if job.store is not None:
                try:
                    job.store.put_baseline(key, row)
                except Exception as exc:  # the cache is an optimisation: say so, go on
                    details["baseline_store_error"] = repr(exc)
        fut.set_result(_tagged(job, result))
        self._show()

    def _watch(self) -> None:
        """Answers the jobs that no worker can take: while jobs are out, looks at the cluster every ``WATCH_S``;
        once it has had no worker of a job's kind for ``worker_wait_s``, every job of that kind gets the
        infrastructure result ``worker_start`` (its task cancelled, so a worker joining later does not run it)."""
        absent = {kind: _Absence(self.worker_wait_s) for kind in ("cuda", "cpu")}
        while not self._stop.wait(min(WATCH_S, self.worker_wait_s / 4)):
            with self._lock:
                kinds = {entry[3] for entry in self._pending.values()}
            has = self._capable() if kinds else {}
            for kind, clock in absent.items():
                waited = clock.over(kind in kinds and not has[kind])
                if waited is not None:
                    self._give_up(kind, waited)

    def _give_up(self, kind: str, waited: float) -> None:
        with self._lock:
            lost = [(job_id, e) for job_id, e in self._pending.items() if e[3] == kind]
            for job_id, _ in lost:
                del self._pending[job_id]
                self._delivered.add(job_id)  # a late result of its task is not written again
        what = "GPU" if kind == "cuda" else "CPU"
        text = (f"the Dask cluster has had no {what} worker for {waited:.0f} s (its worker was lost and none came "
                "back): the job was not run")
        for job_id, (dfut, fut, job, _) in lost:
            try:
                dfut.cancel()
            except Exception:  # the client is gone with the scheduler: nothing left to cancel
                pass
            fut.set_result(_tagged(job, infra_result(job.config, "worker_start", text, breaker=True, job_id=job_id)))
        self._show()

    def _wait(self, dfut: Any, kind: str) -> Any:
        """``dfut``'s result, or :class:`SandboxError` once the cluster has had no worker of ``kind`` for
        ``worker_wait_s`` (the same bound as the jobs', for a task outside them)."""
        from distributed import TimeoutError as DaskTimeout  # asyncio's, not the builtin, before Python 3.11

        clock = _Absence(self.worker_wait_s)
        while True:
            try:
                return dfut.result(timeout=WATCH_S)
            except (TimeoutError, DaskTimeout):
                pass
            waited = clock.over(not self._capable()[kind])
            if waited is not None:
                dfut.cancel()
                raise SandboxError(f"the Dask cluster has had no {'GPU' if kind == 'cuda' else 'CPU'} worker for "
                                   f"{waited:.0f} s")

    def profile(self, problem: Problem, source: str, config: dict | None = None, small: bool = False) -> Any:
        """:func:`kernellab.sandbox.profile` on a GPU worker of the cluster, inside that worker's exclusive hold
        of its GPU (what a campaign calls for its new bests)."""
        from ._profile import ProfileResult

        data = {"problem": _problem_data(problem), "source": source, "config": config, "small": small}
        try:
            self.require("cuda")
            out = self._wait(self.client.submit(_remote_profile, data, resources={GPU_SLOT: 1}, pure=False, retries=1),
                             "cuda")
        except SandboxError as exc:
            return ProfileResult([], reason=f"profiling skipped: {exc}")
        except Exception as exc:  # profiling is optional: say why, go on
            return ProfileResult([], reason=f"profiling failed on the cluster: {type(exc).__name__}: {exc}")
        return ProfileResult([tuple(r) for r in out["rows"]], reason=out["reason"], dropped=out["dropped"])

    def remote_profile(self, problem: Problem, source: str, config: dict | None = None, small: bool = False) -> Any:
        return self.profile(problem, source, config=config, small=small)

    def worker_pids(self) -> dict[str, int]:
        """Dask worker address -> the pid of its process (tests kill one)."""
        return self.client.run(_worker_pid)

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.items())
        self._stop.set()
        for job_id, (dfut, fut, _, _) in pending:
            dfut.cancel()
            with self._lock:
                self._pending.pop(job_id, None)
                self._delivered.add(job_id)
            if not fut.done():
                fut.set_result(infra_result(None, "shutdown", "the executor was shut down"))
        try:
            self.client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()


def _wanted(device: str | None) -> str | None:
    """The device kind ``device`` asks for (None: any); :class:`SandboxError` for anything else."""
    if device is not None and device.startswith("cuda"):
        return "cuda"
    if device not in (None, "cpu"):
        raise SandboxError(f"device must be 'cpu' or 'cuda', not {device!r}")
    return device


def _tagged(job: EvalJob, result: dict) -> dict:
    if job.tag is not None:
        result.setdefault("details", {})["tag"] = job.tag
    return result


def _remote_profile(data: dict) -> dict:
    """Nsight Compute on this worker's GPU, inside its exclusive hold (no other job's work runs under it)."""
    from distributed import get_worker

    from ._profile import profile

    ex = get_worker().kernellab_executor
    problem = _problem_of(data["problem"])
    with ex.exclusive_gpu(problem, small=bool(data["small"])) as gpu:
        rows = profile(problem, data["source"], config=data.get("config"), small=bool(data["small"]), gpu=gpu)
    return {"rows": _plain([list(r) for r in rows]), "reason": rows.reason, "dropped": _plain(rows.dropped)}

