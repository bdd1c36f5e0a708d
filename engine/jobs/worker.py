"""The worker: one process runs one queued run (a k-seed job from its leader row) from the store.

    python -m engine --store STORE worker RUN_ID --threads 1     (the job manager's cold start)
    python -m engine.jobs.standby …                               (a warm start: the same run_worker)
"""
from __future__ import annotations

import sys

from engine.jobs.kinds import run_queued
from engine.store.db import RunStore
from engine.store.lifecycle import Cancelled, error_line


def run_worker(store_path, run_id: int, *, threads: int = 1, prepared=None) -> int:
    """Run (or resume) run ``run_id`` of the store at ``store_path`` with ``threads`` torch threads; a Cancel
    (SIGTERM) ends it with exit code 0 (the lifecycle recorded it). ``prepared``: config → its ready
    preparation or None (the standby's head start)."""
    import torch

    store = RunStore(store_path)
    torch.set_num_threads(threads)
    try:
        run_queued(store, run_id, prepared=prepared)
    except Cancelled:
        return 0
    return 0


def main(store_path, run_id: int, *, threads: int = 1, prepared=None) -> int:
    """:func:`run_worker` with the CLI's error rule: an error a user can act on prints one line (``error: …``,
    exit 2; the run's row already says why it failed)."""
    try:
        return run_worker(store_path, run_id, threads=threads, prepared=prepared)
    except Exception as e:  # noqa: BLE001 - the one-line rule; anything else propagates with its traceback
        line = error_line(e, store_path=store_path)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
