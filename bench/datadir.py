"""Shared by the bench scripts (run as ``python bench/NAME.py`` from the repository root)."""
import os
from pathlib import Path


def use_shared_data() -> None:
    """Point the engine at the staged datasets beside the repository (../shared/data) unless
    $PRIVACY_LAB_DATA_DIR already says where the data is."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    if "PRIVACY_LAB_DATA_DIR" not in os.environ and shared.is_dir():
        os.environ["PRIVACY_LAB_DATA_DIR"] = str(shared)
