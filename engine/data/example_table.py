"""The worked example of "your own data": a small table derived from the shipped UCI Adult with each owner's
chosen ε in a column (``assets/adult_budgets/adult_budgets.csv.gz``; its README states the rule and licence).

The rule (seed :data:`EXAMPLE_SEED`, numpy's ``default_rng``): from Adult's official training file, rows with
``?`` dropped (30,162), :data:`EXAMPLE_ROWS` rows drawn without replacement and kept in file order; then each
owner's budget drawn independently: ε = 3 with probability 0.54, 2 with 0.37, 1 with 0.09 (the privacy-preference
shares of the lab's ``random_54_37_9`` preset: pragmatists, unconcerned, fundamentalists). Columns: a subset of
Adult's, the label ``income`` as its text, the budget ``eps``.

Regenerate: ``python -m engine.data.example_table`` (writes the file; the same bytes decompressed every time).
"""
from __future__ import annotations

import gzip
import io
import sys
from pathlib import Path

import numpy as np

from .files import ASSETS_DIR
from .tabular import _adult_frame, _read

EXAMPLE_SEED = 61
EXAMPLE_ROWS = 4000
EXAMPLE_FOLDER = "adult_budgets"
EXAMPLE_FILE = f"{EXAMPLE_FOLDER}/adult_budgets.csv.gz"  # relative to the data folder, else assets/
EXAMPLE_COLUMNS = ("age", "workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                   "capital-gain", "hours-per-week", "income")
BUDGETS = (3.0, 2.0, 1.0)
BUDGET_SHARES = (0.54, 0.37, 0.09)
#: the example's schema (a run config's "data" section and tiers.column): label, attributes, budget column
EXAMPLE_SCHEMA = {"file": EXAMPLE_FILE, "label": "income", "attributes": ["sex", "race"], "budget": "eps"}


def example_csv_text() -> str:
    """The example table as CSV text, drawn from the shipped Adult training file (checksum-verified) by the
    module's rule."""
    (raw,) = _read("adult", ASSETS_DIR, "adult", ["adult.data.gz"])
    df = _adult_frame(raw, False, "adult.data")
    df["income"] = np.where(df["income"] == 1, ">50K", "<=50K")
    rng = np.random.default_rng(EXAMPLE_SEED)
    rows = np.sort(rng.choice(len(df), size=EXAMPLE_ROWS, replace=False))
    out = df.iloc[rows][list(EXAMPLE_COLUMNS)].reset_index(drop=True)
    out["eps"] = rng.choice(np.array(BUDGETS), size=EXAMPLE_ROWS, p=np.array(BUDGET_SHARES))
    buf = io.StringIO()
    out.to_csv(buf, index=False, lineterminator="\n", float_format="%g")
    return buf.getvalue()


def write_example(dest: Path | None = None) -> Path:
    """Write the example as gzip (no name or time in its header, so the bytes depend on the content only)."""
    dest = Path(dest) if dest is not None else ASSETS_DIR / EXAMPLE_FILE
    dest.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(example_csv_text().encode("utf-8"))
    dest.write_bytes(buf.getvalue())
    return dest


if __name__ == "__main__":  # pragma: no cover
    print(write_example(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
