"""The server's shared handles: the run store (its path and a read-only handle), the process-wide job manager,
and the datasets every page and session share (loaded once per server).

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import functools
import os

import streamlit as st

from app_pages._look import show_error
from engine.config.schema import ConfigError
from engine.data import DataError, load_dataset
from engine.jobs.exiting import at_exit_skip_final_collection
from engine.jobs.manager import JobManager
from engine.store.db import RunStore, default_store_path


def store_path() -> str:
    """The run store file: $PRIVACY_LAB_STORE (a file or a folder), else ~/.privacy-imbalance-lab."""
    return _resolve_store(os.environ.get("PRIVACY_LAB_STORE") or str(default_store_path()))


@functools.lru_cache(maxsize=16)
def _resolve_store(path: str) -> str:
    return str(RunStore(path).path)  # creates the file and schema once


def store() -> RunStore:
    return RunStore(store_path(), readonly=True)  # read paths: mode=ro, never writes (StoreError → st.error)


@st.cache_resource(show_spinner=False, on_release=lambda m: m.shutdown())
def _manager(path: str) -> JobManager:
    at_exit_skip_final_collection()  # the server ends about a second sooner (engine.jobs.exiting)
    workers = os.environ.get("PRIVACY_LAB_WORKERS")
    mgr = JobManager(path, max_workers=int(workers) if workers else None)
    _started.add(path)
    return mgr


_started: set[str] = set()  # the stores whose manager this server has started


def manager() -> JobManager:
    """The process-wide job manager of this store (starts the scheduler; recovers dead runs)."""
    return _manager(store_path())


def started_manager() -> JobManager | None:
    """The job manager if this server has started it, else None (starting it spawns the standby workers, whose
    torch imports share the cores with a fresh server's first page: the sidebar waits for its next refresh)."""
    return manager() if store_path() in _started else None


@st.cache_resource(show_spinner="Loading dataset…", max_entries=4)
def dataset(name: str, max_train: int | None = None):
    """A dataset shared by every page and session of this server (loaded once)."""
    return load_dataset(name, max_train=max_train)


def dataset_or_error(name: str, max_train, errors: list[str]):
    """The (cached) dataset, or None after showing why it cannot be loaded (the reason goes to ``errors``)."""
    try:
        return dataset(name, int(max_train) or None)
    except (DataError, ConfigError) as e:
        errors.append(str(e))
        show_error(e)
        return None
