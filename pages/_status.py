"""A run's status row on the pages: progress text from the one run row, a smoothed ETA, the state in words
("cancelled by you"), the badge and the Cancel / Resume buttons.

(The file name starts with "_": Streamlit never lists it as a page.)
"""
from __future__ import annotations

import time
from typing import Callable

import streamlit as st

from engine.jobs import eta_seconds
from engine.runs import dp_note, run_label
from pages import _common as ui


def queue_positions(runs: list[dict]) -> dict[int, int]:
    """Run id → 1-based place in the queue (oldest queued first), from one ``list_runs`` read."""
    queued = sorted(r["id"] for r in runs if r["status"] == "queued")
    return {rid: i + 1 for i, rid in enumerate(queued)}


class SmoothEta:
    """A run's remaining time, smoothed: the step rate is an exponential moving average over the refreshes
    (weight ``alpha`` for the newest rate), so the ETA neither jumps with one slow evaluation nor reads a
    stale value. Kept per session (``st.session_state``); reads only the run row it is given."""

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


def smooth_eta() -> SmoothEta:
    return st.session_state.setdefault("eta-smoother", SmoothEta())


USER_STOPS = ("by the user", "before it started", "terminated by signal")  # engine.jobs.cancel, engine.train


def state_words(run: dict) -> str:
    """A run's status in words a user reads at a glance ("cancelled by you", not "cancelled")."""
    status, error = run["status"], run.get("error") or ""
    if status == "cancelled":  # Cancel (Train, Runs, the CLI) stops the worker with a signal
        return "cancelled by you" if any(m in error for m in USER_STOPS) else "cancelled"
    if status == "interrupted":
        return "interrupted (worker stopped)"
    if status == "failed":
        return "failed (see the message)"
    return status


def progress_text(run: dict, queue: dict[int, int], eta: Callable[[dict], float | None] = eta_seconds) -> str:
    """A training run's progress line: label, queue place / step / ETA, DP note; everything from the one
    run row (and queue places from the same read), so progress and status never disagree."""
    label = run_label(run)
    total, step = run["total_steps"] or 0, run["step"] or 0
    if run["status"] == "queued":
        pos = queue.get(run["id"])
        text = f"{label} — waiting for a worker" + (f" (#{pos} in the queue)" if pos else "")
    elif run["status"] == "running" and not total:
        text = f"{label} — starting…"
    elif run["status"] == "running":
        left = eta(run)
        text = f"{label} — step {step}/{total}" + (f" · about {ui.fmt_seconds(left)} left" if left is not None else "")
    else:
        took = (run["finished_at"] - run["started_at"]) if run.get("finished_at") and run.get("started_at") else None
        step = total if run["status"] == "finished" and total else step
        text = f"{label} — step {step}/{total or '?'}" + (f" · took {ui.fmt_seconds(took)}" if took is not None else "")
    note = dp_note(run)
    return text + (f" · ⚠ {note}" if note else "")


def audit_progress_text(run: dict, mgr) -> str:
    total, step = run["total_steps"] or 0, run["step"] or 0
    if run["status"] == "queued":
        pos = mgr.queue_position(run["id"])
        return "queued" + (f" (#{pos} in the queue)" if pos else "")
    if run["status"] == "running" and total and step >= total:
        return "statistics…"
    eta = smooth_eta()(run)
    return f"training step {step}/{total or '?'} (all chunks of all algorithms)" + (
        f" · about {ui.fmt_seconds(eta)} left" if eta is not None else "")


def status_row(run: dict, text: str, mgr, *, key_prefix: str = "", resume: bool = False) -> None:
    """Progress bar, status badge, Cancel (active runs) or Resume (stopped audits), and the run's error.

    Buttons are keyed ``{key_prefix}cancel-{id}`` / ``{key_prefix}resume-{id}`` (tests and the browser find
    them by key); a click reruns the enclosing fragment (Cancel) or the page (Resume).
    """
    c1, c2, c3 = st.columns([6, 1.3, 1.2], vertical_alignment="center")
    total, step = run["total_steps"] or 0, run["step"] or 0
    done = run["status"] == "finished"  # (the row's step may lag its last batch of step metrics)
    c1.progress(1.0 if done else min(1.0, step / total) if total else 0.0, text=ui.md(text))
    with c2:
        ui.status_badge(run["status"], state_words(run))
    if ui.is_active(run):
        if c3.button("Cancel", key=f"{key_prefix}cancel-{run['id']}", icon=":material/stop_circle:"):
            mgr.cancel(run["id"])
            st.rerun(scope="fragment")
    elif resume and run["status"] in ("cancelled", "interrupted", "failed"):
        if c3.button("Resume", key=f"{key_prefix}resume-{run['id']}", icon=":material/play_arrow:",
                     help="Continue from the last completed chunk of models"):
            mgr.resume(run["id"])
            st.rerun()
    if run["status"] in ("failed", "interrupted", "cancelled") and run.get("error"):
        c1.caption(ui.md(f"{state_words(run)}: {run['error']}"))
