"""Shared by the bench scripts (run as ``python bench/NAME.py`` from the repository root)."""
import os
from pathlib import Path


def use_shared_data() -> None:
    """Point the engine at the staged datasets beside the repository (../shared/data) unless
    $PRIVACY_LAB_DATA_DIR already says where the data is."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    if "PRIVACY_LAB_DATA_DIR" not in os.environ and shared.is_dir():
        os.environ["PRIVACY_LAB_DATA_DIR"] = str(shared)


def interleaved_ms(steps: dict, rounds: int, warmup: int = 3) -> dict:
    """Median milliseconds per call of each function in ``steps`` (name → zero-argument callable), timed
    interleaved — round r calls every function once — after ``warmup`` calls of each, so that a change in the
    machine's load falls on all of them alike."""
    import statistics
    import time

    times = {k: [] for k in steps}
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    for _ in range(rounds):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: 1000 * statistics.median(v) for k, v in times.items()}
