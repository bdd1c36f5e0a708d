"""How long a job takes: the one owner of run-time estimates, before a launch and while it runs.

    seconds_per_sample(config, history)   seconds per sample-gradient on this machine: the median over the store's
                                          finished runs of the same dataset and model (else a rough constant)
    start_seconds(history, warm)          a launch's start on this machine (worker, data, plan): the median over
                                          the store's launches of their first run's wait, warm (a ready standby)
                                          or cold (a worker importing torch) as asked (else a rough constant)
    run_time_estimate(jobs, history, w)   a comparison's (or a sweep's) wall time: each run's steps × expected
                                          batch × k seeds × that rate, the runs shared out over w worker processes,
                                          plus one start per wave of w runs (``JobManager.run_time_estimate``
                                          gives it the manager's workers and ready standbys); without history,
                                          the rough constants are slowed by what the machine does now
    busy_elsewhere(active), contention    the machine's other busy processes (its load average less the lab's own
                                          running workers) and how much slower they make a worker than alone
    eta_seconds(run)                      a running run's remaining seconds from its progress so far
    SmoothEta                             the live view's ETA: from the progress seen since this viewer first saw
                                          the run (the start is not a step), never rising except to re-anchor
    format_seconds(s)                     "42 s", "3.5 min", "2.1 h"

An audit's estimate measures its own chunk's steps (:func:`engine.audit.pa_alooa.estimate.estimate_runtime`). Nothing
here calls Streamlit. ``bench/estimates.py`` compares every estimate with the wall time of the same launch.
"""
from __future__ import annotations

import math
import os
import statistics
import time

from engine.config.run import RunConfig

# one core, per sample-gradient (rough), by model, and by (model, dataset) where the input size changes it: the
# Papernot CNN measured 5.2-5.4e-5 on digits (the default comparison, bench/estimates.py) and ~1.3e-4 on MNIST
# (bench/step_overhead.py) on a quiet 2-core machine
FALLBACK_SECONDS_PER_SAMPLE = {"cnn": 1.3e-4, "mlp": 6e-5, "lr": 2e-5, "resnet18": 5e-3, ("cnn", "digits"): 6e-5}
FALLBACK_START_SECONDS = 5.0  # a worker process importing torch, loading the data and planning, on 2 cores (rough)
FALLBACK_WARM_START_SECONDS = 0.5  # a ready standby taking the run, loading the data and planning (rough)
MEASURED = "measured on this machine"  # how a rate found from this store's runs is said (else it is a rough one)
WARM_START_MAX_SECONDS = 1.5  # a longer wait is a cold start: importing torch alone takes longer on 2 cores


def seconds_per_sample(config: RunConfig, history: list[dict]) -> tuple[float, str]:
    """(seconds of training per sample-gradient for ``config``'s dataset and model, how it was found): the median
    over the finished runs in ``history`` (store rows) that match (measured on this machine), else a rough
    per-model constant."""
    rates = []
    for r in history:
        cfg = r.get("config") or {}
        if r["status"] != "finished" or not r.get("started_at") or not r.get("finished_at") or not r.get("total_steps"):
            continue
        if r.get("job_id") not in (None, r["id"]):
            continue  # a seed replica: its job (one worker, k models, its config's seeds) is timed by row 0
        if (cfg.get("data") or {}).get("name") != config.data.name or \
                (cfg.get("model") or {}).get("name") != config.model.name:
            continue
        samples = r["total_steps"] * max(1, int(cfg.get("batch_size") or 1)) * max(1, int(cfg.get("seeds") or 1))
        rates.append((r["finished_at"] - r["started_at"]) / samples)
    if rates:
        return statistics.median(rates), f"{MEASURED} from {len(rates)} finished run(s)"
    model = config.model.name if config.model.name in FALLBACK_SECONDS_PER_SAMPLE else "cnn"
    rate = FALLBACK_SECONDS_PER_SAMPLE.get((model, config.data.name), FALLBACK_SECONDS_PER_SAMPLE[model])
    return rate, "a rough estimate until a run of this dataset and model has finished"


def busy_elsewhere(active_workers: int = 0) -> float:
    """Processes busy on this machine besides the lab's ``active_workers`` training runs: the 1-minute load average
    less those (≥ 0; 0 where the OS keeps no load average)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0
    return max(0.0, load - active_workers)


def contention(workers: int, others: float, cores: int | None = None) -> float:
    """How many times slower each of ``workers`` one-thread worker processes trains than alone on a quiet machine,
    beside ``others`` busy processes (:func:`busy_elsewhere`): the ``cores`` are shared by all of them (≥ 1)."""
    if not cores:  # the cores this process may use (a container's share), else the machine's
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1.0, (workers + max(0.0, others)) / cores)


def start_seconds(history: list[dict], *, warm: bool | None = None) -> tuple[float, bool]:
    """(seconds from Launch to a run's first step, measured?): the median over the launches (groups) in
    ``history`` of their first run's created → started wait, which holds a worker start (or a warm standby's
    hand-over), the data and the plan but no queueing behind the launch's own runs; else a rough constant.

    ``warm``: whether the launch finds a ready standby (``JobManager.standbys_ready``). A warm hand-over takes a
    fraction of a second, a cold start imports torch (seconds): measured here, one was 0.3 s and the other 6–8 s
    on the same machine, so mixing them would miss both. A wait of at most ``WARM_START_MAX_SECONDS`` counts as
    a warm start, a longer one as cold; ``warm`` picks the median of its kind (None: of every launch)."""
    first: dict = {}
    for r in history:
        if r.get("started_at") is not None and r.get("created_at") is not None and r.get("group_id"):
            wait = r["started_at"] - r["created_at"]
            first[r["group_id"]] = min(wait, first.get(r["group_id"], wait))
    waits = sorted(max(0.0, w) for w in first.values())
    if warm is not None:
        waits = [w for w in waits if (w <= WARM_START_MAX_SECONDS) == warm]
    if not waits:
        return (FALLBACK_WARM_START_SECONDS if warm else FALLBACK_START_SECONDS), False
    return statistics.median(waits), True


def run_time_estimate(jobs, history: list[dict], workers: int, *, ready_standbys: int | None = None,
                      prewarm: bool = True, others: float = 0.0, cores: int | None = None) -> tuple[float, str] | None:
    """(seconds, how) from Launch to the last run's end, for runs started together: ``jobs`` is a list of
    (config, steps, expected batch size or None for the config's batch size); each run trains for steps ×
    batch × k seeds × :func:`seconds_per_sample`, the runs shared out over ``workers`` worker processes (never
    less than the longest run), and each wave of ``workers`` runs starts in :func:`start_seconds`: the first
    wave warm when ``ready_standbys`` cover it (None: not known, the median of every launch), later waves warm
    when the manager prewarms (``prewarm``: their standbys warm while the first wave trains). None for no runs.

    ``others``: processes busy beside the launch (:func:`busy_elsewhere`). A rough constant (no run of this dataset
    and model measured here yet) is for a worker alone on a core: it is slowed by :func:`contention` of the
    launch's workers and ``others`` on the ``cores``, and so is a rough start (a first estimate on a busy machine
    said 1.6 min for runs that took 9.2 at a load of 7–8.5 on 2 cores). A measured rate already holds how this
    machine trains, and is kept."""
    total, how, rough = [], "", False
    for config, steps, batch in jobs:
        rate, how = seconds_per_sample(config, history)
        rough |= not how.startswith(MEASURED)
        total.append(steps * (batch or config.batch_size) * max(1, int(getattr(config, "seeds", 1) or 1)) * rate)
    if not total:
        return None
    workers = max(1, workers)
    waves = -(-len(total) // workers)
    slow = contention(min(workers, len(total)), others, cores)
    if rough and slow > 1.0:
        total = [t * slow for t in total]
        how += f", × {slow:.1f} for the machine's load now ({others:.1f} other busy processes)"
    warm = None if ready_standbys is None else ready_standbys >= min(len(total), workers)
    start, measured = start_seconds(history, warm=warm)
    later = start_seconds(history, warm=prewarm if ready_standbys is not None else None)[0]
    if not measured:
        start, later = start * slow, later * slow
    how += "; starting measured too" if measured else "; a rough start time"
    how += {None: "", True: " (a warm worker is ready)", False: " (no warm worker ready: a cold start)"}[warm]
    return max(max(total), sum(total) / workers) + start + (waves - 1) * later, how


def eta_seconds(run: dict, now: float | None = None) -> float | None:
    """Remaining seconds from the run's progress so far (None until it has made progress)."""
    if run.get("status") != "running" or not run.get("started_at") or not run.get("total_steps"):
        return None
    step = run.get("step") or 0
    if step <= 0:
        return None
    elapsed = (now or time.time()) - run["started_at"]
    return max(0.0, elapsed / step * (run["total_steps"] - step))


class SmoothEta:
    """A run's remaining time as the live view shows it, from one viewer's refreshes (keep one per viewer: the
    page keeps it in its session; it reads only the run row it is given).

    * The step rate is the progress seen over the last ``window`` seconds of this viewer's readings, since it
      first saw the run make progress: the worker's start and first evaluation are not steps, so a rate from
      ``started_at`` would put the first ETA far too high; a window of several evaluations keeps a pause from
      swinging it, and lets it follow a machine that gets busier. Until a second sighting has moved on there is
      no ETA (None).
    * The shown ETA counts down with the clock between readings (one that stands still says nothing: it sat at
      "7.1 min" for 90 s on a loaded machine) and drops to the rate's ETA when that is lower. It rises only to
      re-anchor: at once when the run really slows down (the rate's ETA ``reanchor`` × the countdown, and more
      than ``slack`` seconds above it), and at a new evaluation of the run when the rate's ETA is more than
      ``drift`` × the countdown (a machine that got busier shows at its next evaluations).
    """

    def __init__(self, reanchor: float = 1.5, slack: float = 5.0, drift: float = 1.2, window: float = 60.0):
        self.reanchor, self.slack, self.drift, self.window = reanchor, slack, drift, window
        # run id → [readings (time, step) oldest first, last ETA shown, when it was shown, the evaluation then]
        self._runs: dict[int, list] = {}

    @staticmethod
    def _evaluation(run: dict, step: int, total: int) -> int:
        """How many evaluations the run has made by ``step`` (its ``eval_every``, else the loop's default)."""
        every = (run.get("config") or {}).get("eval_every") or max(1, total // 25)
        return step // max(1, int(every))

    def __call__(self, run: dict, now: float | None = None) -> float | None:
        now = time.time() if now is None else now
        step, total = run.get("step") or 0, run.get("total_steps") or 0
        if run.get("status") != "running" or step <= 0 or not total:
            if run.get("status") != "running":
                self._runs.pop(run["id"], None)
            return None
        evaluation = self._evaluation(run, step, total)
        seen = self._runs.get(run["id"])
        if seen is None or step < seen[0][-1][1]:  # first sighting (or the run restarted from a checkpoint)
            self._runs[run["id"]] = [[(now, step)], None, now, evaluation]
            return None
        readings, shown, t_shown, at = seen
        if step == readings[0][1] or now <= readings[0][0]:
            return shown  # no progress since the first sighting: nothing to measure yet
        readings.append((now, step))
        # the rate over the last window: the oldest reading kept reaches back to it, and is behind this step
        while len(readings) > 2 and readings[1][0] <= now - self.window and readings[1][1] < step:
            readings.pop(0)
        t0, s0 = readings[0]
        raw = max(0.0, (total - step) * (now - t0) / (step - s0))
        if shown is None:
            shown = raw
        else:
            countdown = max(0.0, shown - max(0.0, now - t_shown))
            slowed = raw > max(self.reanchor * countdown, countdown + self.slack)
            busier = evaluation > at and raw > self.drift * countdown
            shown = raw if raw <= countdown or slowed or busier else countdown
        seen[1:] = [shown, now, evaluation]
        return shown


def format_seconds(s: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h`` (``—`` for none)."""
    if s is None:
        return "—"
    s = float(s)
    if not math.isfinite(s):
        return "—"
    return f"{s:.0f} s" if s < 90 else (f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h")
