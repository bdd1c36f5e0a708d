"""A run's status row on the pages: the progress line (from the one run row, queue places from the manager's
``queue_positions``, the ETA from ``engine.jobs.estimates``), the state in words ("cancelled by you"), the
badge and the Cancel / Resume buttons; and how often the live views poll.

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import streamlit as st

from app_pages._look import md
from engine.jobs.estimates import SmoothEta, eta_seconds, format_seconds
from engine.jobs.manager import queue_positions
from engine.jobs.runs import diverged_note, dp_note, run_label
from engine.store.db import ACTIVE, ENDED
from engine.store.lifecycle import stopped_by_user

LIVE_INTERVAL = 0.5  # seconds between live refreshes while runs are active (≥ 1 update/s)
STATUS_COLORS = {"queued": "gray", "running": "blue", "finished": "green", "diverged": "red", "failed": "red",
                 "cancelled": "orange", "interrupted": "violet"}
STATUS_ICONS = {"queued": ":material/schedule:", "running": ":material/play_arrow:", "finished": ":material/check:",
                "diverged": ":material/trending_up:", "failed": ":material/error:", "cancelled": ":material/stop:",
                "interrupted": ":material/bolt:"}


def is_active(run: dict) -> bool:
    return run["status"] in ACTIVE


def smooth_eta() -> SmoothEta:
    """This session's ETA smoother (its step rates are per viewer: kept in ``st.session_state``)."""
    return st.session_state.setdefault("eta-smoother", SmoothEta())


def cancelling(run: dict) -> bool:
    """The user asked to cancel this active run (the store recorded the click: ``RunStore.request_cancel``) and
    its worker has not stopped yet."""
    return run["status"] in ACTIVE and run.get("cancel_requested_at") is not None


def state_words(run: dict) -> str:
    """A run's status in words a user reads at a glance ("cancelled by you", not "cancelled")."""
    status, error = run["status"], run.get("error") or ""
    if cancelling(run):
        return f"cancelling… (the run stops at step {run['cancel_step']})"
    if status == "cancelled":  # Cancel (Train, Runs, the CLI) stops the worker with a signal
        return "cancelled by you" if stopped_by_user(error) else "cancelled"
    if status == "interrupted":
        return "interrupted (worker stopped)"
    return status


def progress_text(run: dict, queue: dict[int, int], eta: Callable[[dict], float | None] = eta_seconds) -> str:
    """A training run's progress line: label, queue place / step / ETA, DP note; everything from the one
    run row (and ``queue``, ``engine.jobs.manager.queue_positions`` of the same refresh), so progress and
    status never disagree."""
    label = run_label(run)
    total, step = run["total_steps"] or 0, run["step"] or 0
    if run["status"] == "queued":
        pos = queue.get(run["id"])
        text = f"{label} — waiting for a worker" + (f" (#{pos} in the queue)" if pos else "")
    elif run["status"] == "running" and not total:
        text = f"{label} — starting…"
    elif run["status"] == "running":
        left = eta(run)
        text = f"{label} — step {step}/{total}" + (f" · about {format_seconds(left)} left" if left is not None else "")
    else:
        took = (run["finished_at"] - run["started_at"]) if run.get("finished_at") and run.get("started_at") else None
        step = total if run["status"] == "finished" and total else step  # (a diverged run may stop early)
        text = f"{label} — step {step}/{total or '?'}" + (f" · took {format_seconds(took)}" if took is not None else "")
    note = dp_note(run)
    return text + (f" · ⚠ {note}" if note else "")


def audit_progress_text(run: dict, queue: dict[int, int], eta: Callable[[dict], float | None] = eta_seconds) -> str:
    """A PA-ALOOA audit's progress line (its steps count every chunk of every algorithm)."""
    total, step = run["total_steps"] or 0, run["step"] or 0
    if run["status"] == "queued":
        pos = queue.get(run["id"])
        return "queued" + (f" (#{pos} in the queue)" if pos else "")
    if run["status"] == "running" and total and step >= total:
        return "statistics…"
    left = eta(run)
    return f"training step {step}/{total or '?'} (all chunks of all algorithms)" + (
        f" · about {format_seconds(left)} left" if left is not None else "")


def one_run_progress_text(run: dict, queue: dict[int, int], eta: Callable[[dict], float | None] = eta_seconds) -> str:
    """A one-run audit's progress line: its runs' steps, then the canaries' scoring."""
    total, step = run["total_steps"] or 0, run["step"] or 0
    if run["status"] == "queued":
        pos = queue.get(run["id"])
        return "queued" + (f" (#{pos} in the queue)" if pos else "")
    if run["status"] == "running" and not total:
        return "preparing the canaries…"
    if run["status"] == "running" and step >= total:
        return "scoring the canaries…"
    if run["status"] != "running":  # finished, failed, cancelled, interrupted
        took = (run["finished_at"] - run["started_at"]) if run.get("finished_at") and run.get("started_at") else None
        head = "every run trained, its canaries scored" if run["status"] == "finished" else \
            f"stopped at step {step}/{total or '?'}"
        return head + (f" · took {format_seconds(took)}" if took is not None else "")
    left = eta(run)
    return f"training step {step}/{total or '?'} (one run per algorithm)" + (
        f" · about {format_seconds(left)} left" if left is not None else "")


@dataclass(frozen=True)
class KindView:
    """What the pages show of a run of one job kind: the page-side table beside ``engine.jobs.kinds.JOB_KINDS``
    (one entry per kind, tested; the page a run is watched on and its link are the kind's own ``watch``)."""

    progress: Callable[..., str]  # (run row, queue places, ETA) → its progress line
    key_prefix: str  # its status row's widget keys ("a-cancel-7")
    resume: bool  # a stopped run resumes from its checkpoints (an audit) instead of being re-run


KIND_VIEWS = {"train": KindView(progress_text, "", False),
              "audit": KindView(audit_progress_text, "a-", True),
              "one_run": KindView(one_run_progress_text, "o-", False)}


def kind_status_row(run: dict, mgr, queue: dict[int, int] | None = None) -> None:
    """``run``'s status row as its kind shows it (``queue``: the refresh's queue places, read here if not given)."""
    view = KIND_VIEWS[run["kind"]]
    if queue is None:
        queue = queue_positions(mgr.store.list_runs(status="queued"))
    status_row(run, view.progress(run, queue, smooth_eta()), mgr, key_prefix=view.key_prefix, resume=view.resume)


def status_badge(status: str) -> None:
    """The state in one word (its column is narrow: "diverged (see the note)" was cut to "diverged (see th…" at
    1400 px); what more there is to say — :func:`state_words`, the error, the diverged note — is the caption beside
    it (:func:`status_detail`)."""
    st.badge(status, icon=STATUS_ICONS.get(status), color=STATUS_COLORS.get(status, "gray"))


def status_detail(run: dict) -> str | None:
    """The line beside a run's badge: why it stopped (the state in words and the error), the diverged note, or
    None."""
    if run["status"] in ("failed", "interrupted", "cancelled") and run.get("error"):
        return f"{state_words(run)}: {run['error']}"
    if state_words(run) != run["status"]:  # "interrupted (worker stopped)": more than the badge says
        return state_words(run)
    if diverged_note(run):
        return f"⚠ {diverged_note(run)}"
    return None


def request_cancel(mgr, run_id: int, step: int | None) -> None:
    """Cancel ``run_id`` at ``step`` without waiting for its worker (the page says "cancelling…" from the store)."""
    mgr.cancel(run_id, wait=False, step=step)


def status_row(run: dict, text: str, mgr, *, key_prefix: str = "", resume: bool = False) -> None:
    """Progress bar, status badge, Cancel (active runs) or Resume (stopped audits), and the run's error.

    Buttons are keyed ``{key_prefix}cancel-{id}`` / ``{key_prefix}resume-{id}`` (tests and the browser find
    them by key); a click reruns the enclosing fragment (Cancel) or the page (Resume).
    """
    c1, c2, c3 = st.columns([6, 1.3, 1.2], vertical_alignment="center")
    total, step = run["total_steps"] or 0, run["step"] or 0
    done = run["status"] in ENDED  # (the row's step may lag its last batch of step metrics)
    c1.progress(1.0 if done else min(1.0, step / total) if total else 0.0, text=md(text))
    with c2:
        if cancelling(run):  # said at once, from the store: the worker stops within a step, the manager finishes it
            st.badge("cancelling…", icon=":material/hourglass_top:", color="orange")
        else:
            status_badge(run["status"])
    if is_active(run):
        # on_click: the click's step is the one this row showed (a loaded server may handle the click seconds
        # later, while the run trains on: nothing after the shown step is counted); the cancel does not wait
        c3.button("Cancelling…" if cancelling(run) else "Cancel", key=f"{key_prefix}cancel-{run['id']}",
                  icon=":material/stop_circle:", disabled=cancelling(run), on_click=request_cancel,
                  args=(mgr, run["id"], step))
    elif resume and run["status"] in ("cancelled", "interrupted", "failed"):
        if c3.button("Resume", key=f"{key_prefix}resume-{run['id']}", icon=":material/play_arrow:",
                     help="Continue from the last completed chunk of models"):
            mgr.resume(run["id"])
            st.rerun()
    detail = status_detail(run)
    if detail:
        c1.caption(md(detail))
