"""How long a job takes: the one owner of run-time estimates, before a launch and while it runs.

    seconds_per_sample(config, history)   seconds per sample-gradient on this machine: the median over the store's
                                          finished runs of the same dataset and model (else a rough constant)
    run_time_estimate(jobs, history, w)   a comparison's (or a sweep's) wall time: each run's steps × expected
                                          batch × k seeds × that rate, the runs shared out over w worker processes
    eta_seconds(run)                      a running run's remaining seconds from its progress so far
    SmoothEta                             the same, its step rate smoothed over refreshes (the live view's ETA)
    format_seconds(s)                     "42 s", "3.5 min", "2.1 h"

An audit's estimate measures its own chunk's steps (:func:`engine.audit.estimate.estimate_runtime`). Nothing
here calls Streamlit.
"""
from __future__ import annotations

import math
import time

from engine.config.run import RunConfig

FALLBACK_SECONDS_PER_SAMPLE = {"cnn": 4e-4, "mlp": 6e-5, "lr": 2e-5, "resnet18": 5e-3}  # one core, per sample-gradient (rough)


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
        rates.sort()
        return rates[len(rates) // 2], f"measured on this machine from {len(rates)} finished run(s)"
    model = config.model.name if config.model.name in FALLBACK_SECONDS_PER_SAMPLE else "cnn"
    return FALLBACK_SECONDS_PER_SAMPLE[model], "a rough estimate until a run of this dataset and model has finished"


def run_time_estimate(jobs, history: list[dict], workers: int) -> tuple[float, str] | None:
    """(seconds, how) for runs started together: ``jobs`` is a list of (config, steps, expected batch size or
    None for the config's batch size); each run takes steps × batch × k seeds × :func:`seconds_per_sample`, the runs
    shared out over ``workers`` worker processes (never less than the longest run). None for no runs."""
    total, how = [], ""
    for config, steps, batch in jobs:
        rate, how = seconds_per_sample(config, history)
        total.append(steps * (batch or config.batch_size) * max(1, int(getattr(config, "seeds", 1) or 1)) * rate)
    if not total:
        return None
    return max(max(total), sum(total) / max(1, workers)), how


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
    """A run's remaining time, smoothed: the step rate is an exponential moving average over the refreshes
    (weight ``alpha`` for the newest rate), so the ETA neither jumps with one slow evaluation nor reads a
    stale value. Reads only the run row it is given; keep one per viewer (the page keeps it in its session)."""

    def __init__(self, alpha: float = 0.3):
        self.alpha = alpha
        self._last: dict[int, tuple[float, int, float | None]] = {}  # run id → (time, step, rate)

    def __call__(self, run: dict, now: float | None = None) -> float | None:
        now = time.time() if now is None else now
        if run["status"] != "running":
            self._last.pop(run["id"], None)
            return None
        raw = eta_seconds(run, now)
        step, total = run["step"] or 0, run["total_steps"] or 0
        if raw is None or step <= 0 or not total:
            return None
        prev = self._last.get(run["id"])
        rate = step / max(1e-9, now - run["started_at"])  # steps/s over the whole run so far
        if prev is not None and prev[2] is not None:
            t0, s0, r0 = prev
            if now > t0 and step > s0:
                rate = self.alpha * (step - s0) / (now - t0) + (1 - self.alpha) * r0
            else:
                rate = r0
        self._last[run["id"]] = (now, step, rate)
        return max(0.0, (total - step) / max(rate, 1e-9))


def format_seconds(s: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h`` (``—`` for none)."""
    if s is None:
        return "—"
    s = float(s)
    if not math.isfinite(s):
        return "—"
    return f"{s:.0f} s" if s < 90 else (f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h")
