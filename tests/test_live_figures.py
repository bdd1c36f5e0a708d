"""Live figures (engine/figures/live.py): a refresh that only brings new evaluations patches the kept figures
in place, and the patched figures equal freshly built ones (property test over random arrival orders)."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.figures import frames, scaffold, training
from engine.figures.live import LiveFigures
from test_plots import diverged_run, make_run, seed_series

NAMES = list(training.LIVE_FIGURES) + ["recall_gain_time"]


def full_runs(diverge: bool = False) -> list[dict]:
    """Two seeds of IDP-SGD and of INO-SGD (one series each) and a DP-SGD run, all running, 11 evaluations."""
    runs = seed_series(1, "idp_sample", 2, offsets=[0.0, 0.03]) + \
        seed_series(3, "ino", 2, offsets=[0.0, 0.03], gains=[0.1, 0.14]) + [make_run(5, "dpsgd", group="gs")]
    if diverge:
        runs[3]["evals"] = diverged_run(4)["evals"]
        runs[3]["evals"][0]["tiers"][0]["loss"] = runs[2]["evals"][0]["tiers"][0]["loss"]
    for r in runs:
        r["status"] = "running"
    return runs


def snapshot(runs: list[dict], counts: list[int]) -> list[dict]:
    """The records a refresh reads when run i has logged counts[i] evaluations."""
    return [{**r, "evals": r["evals"][:n]} for r, n in zip(runs, counts)]


def _close(a, b, path="") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, sorted(set(a) ^ set(b or {})))
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple, np.ndarray)):
        assert isinstance(b, (list, tuple, np.ndarray)) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, (float, int, np.floating, np.integer)) and not isinstance(a, bool):
        assert isinstance(b, (float, int, np.floating, np.integer)), (path, a, b)
        assert np.isclose(float(a), float(b), rtol=1e-9, atol=1e-12, equal_nan=True), (path, a, b)
    else:
        assert a == b, (path, a, b)


def assert_same_figure(patched: go.Figure, fresh: go.Figure, what: str = "") -> None:
    """Data, shapes, annotations, axes — the whole figure but its (shared) template — within float tolerance."""
    a, b = patched.to_plotly_json(), fresh.to_plotly_json()
    a["layout"].pop("template", None), b["layout"].pop("template", None)
    _close(a["data"], b["data"], f"{what} data")
    _close(a["layout"], b["layout"], f"{what} layout")


def assert_same_specs(got: dict, runs: list[dict], **options) -> None:
    fresh = {s.name: s for s in training.build_figures(runs, names=NAMES, **options)}
    assert list(got) == NAMES
    for name in NAMES:
        assert_same_figure(got[name].figure, fresh[name].figure, name)
        assert got[name].data.reset_index(drop=True).equals(fresh[name].data.reset_index(drop=True)), name


OPTIONS = st.fixed_dictionaries({
    "mid_layout": st.sampled_from(["facet", "overlay"]),
    "x_axis": st.sampled_from(["step", "epoch", "elapsed", "epsilon"]),
    "smoothing": st.sampled_from([0.0, 0.6]),
    "bands": st.booleans(),
})


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=OPTIONS, diverge=st.booleans(),
       arrivals=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), min_size=2, max_size=4))
def test_patched_figures_equal_a_fresh_build(options, diverge, arrivals):
    runs = full_runs(diverge)
    counts = [1] * len(runs)
    live = LiveFigures(NAMES, **options)
    for batch in arrivals:  # each refresh: some runs log one more evaluation each time they are named
        for i in batch:
            counts[i] = min(counts[i] + 1, len(runs[i]["evals"]))
        records = snapshot(runs, counts)
        assert_same_specs(live.update(records), records, **options)
    assert live.builds >= len(NAMES)  # the first refresh builds every figure


@pytest.mark.slow
def test_new_evaluations_patch_without_calling_the_builders(monkeypatch):
    runs = full_runs()
    live = LiveFigures(NAMES)
    first = live.update(snapshot(runs, [4] * 5))  # MID ongoing in ε=1 (onset step 10, last step 30)
    assert (live.builds, live.patches) == (len(NAMES), 0)
    calls = []

    def forbid(name):
        def f(*a, **k):
            calls.append(name)
            raise AssertionError(f"{name} called on the patch path")
        return f

    monkeypatch.setattr(scaffold, "render", forbid("render"))
    monkeypatch.setattr(training, "build_figures", forbid("build_figures"))
    monkeypatch.setattr(scaffold, "make_subplots", forbid("make_subplots"))
    for cls in ("Scatter", "Figure", "Bar", "Table"):
        monkeypatch.setattr(go, cls, forbid(f"go.{cls}"))
    for n in range(5, 12):
        specs = live.update(snapshot(runs, [n] * 5))
        assert all(specs[k].figure is first[k].figure for k in NAMES)  # the kept figures, patched in place
    assert calls == [] and live.builds == len(NAMES) and live.patches == 7 * len(NAMES)
    monkeypatch.undo()
    mid = specs["mid_curves"].figure
    assert len(mid.data[0].x) == 11  # the points appended
    assert [s.x1 for s in mid.layout.shapes][:1] == [60]  # the MID span's end moved from 30 to its recovery
    assert_same_specs(specs, snapshot(runs, [11] * 5))


@pytest.mark.slow
def test_a_view_change_redraws_from_the_kept_frames(monkeypatch):
    """A view change (x unit, smoothing, layout) with nothing new logged computes no data frame from the runs'
    evaluations, only the plans and figures (equal to a fresh build); a refresh with nothing new rebuilds
    nothing; a new evaluation reads the frames again and patches."""
    runs = full_runs()
    records = snapshot(runs, [6] * 5)
    live = LiveFigures(NAMES)
    live.update(records)
    reads = []
    for name in ("tier_history", "class_history", "overall_history", "mid_spans", "recall_gain_over_time"):
        real = getattr(frames, name)
        monkeypatch.setattr(frames, name, lambda *a, _real=real, _name=name, **k: (reads.append(_name), _real(*a, **k))[1])
    for change in ({"x_axis": "epoch"}, {"x_axis": "epoch", "smoothing": 0.6},
                   {"x_axis": "elapsed", "smoothing": 0.6, "mid_layout": "overlay"}, {}):
        options = {"mid_layout": "facet", "x_axis": "step", "smoothing": 0.0, **change}
        builds = live.builds
        specs = live.update(records, **options)
        assert reads == [], (change, reads)
        assert live.builds == builds + len(NAMES) and live.frame_reads == 1
        again = live.update(records, **options)  # a refresh with nothing new
        assert (live.builds, reads) == (builds + len(NAMES), [])
        assert all(again[k].figure is specs[k].figure for k in NAMES)
        assert_same_specs(specs, records, **options)
        reads.clear()  # (the fresh build's own reads)
    patches = live.patches
    live.update(snapshot(runs, [7] * 5))  # a new logged step: the frames are read again and the figures patched
    assert reads and live.frame_reads == 2 and live.patches == patches + len(NAMES)


@pytest.mark.slow
def test_structural_changes_rebuild():
    runs = full_runs()
    live = LiveFigures(NAMES)
    live.update(snapshot(runs, [3] * 5))
    live.update(snapshot(runs, [3] * 5))  # nothing new: neither built nor patched
    assert (live.builds, live.patches) == (len(NAMES), 0)
    records = snapshot(runs, [4] * 5)
    records[4] = {**records[4], "status": "finished"}  # a status change
    live.update(records)
    assert live.builds == 2 * len(NAMES)
    live.update(snapshot(runs, [4] * 4))  # a run left the selection
    assert live.builds == 3 * len(NAMES)
    diverging = full_runs(diverge=True)
    live = LiveFigures(NAMES)
    live.update(snapshot(diverging, [5] * 5))
    specs = live.update(snapshot(diverging, [7] * 5))  # INO seed 1 diverges at step 50: the MID chart is rebuilt
    assert live.builds == len(NAMES) + 1 and live.patches == len(NAMES) - 1
    fig = specs["mid_curves"].figure
    assert [a.text for a in fig.layout.annotations if a.name == "diverged"] == ["diverged"]
    assert_same_specs(specs, snapshot(diverging, [7] * 5))
    specs = live.update(snapshot(diverging, [7] * 5), x_axis="epoch")  # a changed option
    assert live.builds == 2 * len(NAMES) + 1 and specs["accuracy"].figure.layout.xaxis.title.text == "epoch"


def test_unknown_names_and_options_are_refused():
    with pytest.raises(ValueError, match="unknown figure"):
        LiveFigures(["nope"])
    with pytest.raises(ValueError, match="smoothing"):
        LiveFigures(NAMES, smoothing=1.0)


@pytest.mark.slow
def test_long_curves_are_drawn_thinned_and_patched_alike(monkeypatch):
    """A curve over MAX_DRAWN_POINTS is drawn with that many evenly spaced points, its first and last kept and
    the band edges on the line's points, in a fresh build and in a patch alike; the frames keep every point."""
    assert scaffold.drawn_points(scaffold.MAX_DRAWN_POINTS) is None
    for n in (scaffold.MAX_DRAWN_POINTS + 1, 10 * scaffold.MAX_DRAWN_POINTS + 7):
        idx = scaffold.drawn_points(n)
        assert len(idx) == scaffold.MAX_DRAWN_POINTS and idx[0] == 0 and idx[-1] == n - 1 and np.all(np.diff(idx) > 0)
    monkeypatch.setattr(scaffold, "MAX_DRAWN_POINTS", 6)
    runs = full_runs()
    live = LiveFigures(NAMES)
    live.update(snapshot(runs, [5] * 5))
    for n in (8, 11):
        specs = live.update(snapshot(runs, [n] * 5))
        assert_same_specs(specs, snapshot(runs, [n] * 5))
    assert live.patches >= len(NAMES)
    mid = specs["mid_curves"]
    steps = sorted(mid.data["step"].unique())
    assert len(steps) == 11  # the frame: every evaluation
    lines = {t.meta: t for t in mid.figure.data if str(t.meta).startswith(("line|", "lo|", "hi|"))}
    assert lines and all(len(t.x) <= 6 for t in lines.values())
    for key, t in lines.items():
        if key.startswith("line|"):
            assert list(t.x)[0] == steps[0] and list(t.x)[-1] == steps[-1]
            unit = key.split("|", 1)[1]
            for edge in ("lo|", "hi|"):
                if edge + unit in lines:
                    assert list(lines[edge + unit].x) == list(t.x)


@pytest.mark.slow
def test_a_refresh_converts_only_the_new_evaluations(monkeypatch):
    """Each stored evaluation becomes its record once: the first refresh converts what is there, every later
    one only what arrived; a run whose status changes (it may have been run again) is read afresh."""
    from engine.train.records import EvalRecord

    converted = []
    real = EvalRecord.from_dict.__func__
    monkeypatch.setattr(EvalRecord, "from_dict", classmethod(lambda cls, d: converted.append(d["step"]) or real(cls, d)))
    runs = full_runs()
    live = LiveFigures(NAMES + ["mid_summary", "recall_auc"])  # tables and bars read the same records
    live.update(snapshot(runs, [4] * 5))
    assert len(converted) == 4 * 5
    for n in range(5, 8):
        converted.clear()
        live.update(snapshot(runs, [n] * 5))
        assert converted == [runs[0]["evals"][n - 1]["step"]] * 5  # one new evaluation per run
    converted.clear()
    live.update(snapshot(runs, [7] * 5))
    assert converted == []  # nothing new: nothing converted
    finished = snapshot(runs, [8] * 5)
    finished[0]["status"] = "finished"
    converted.clear()
    live.update(finished)
    # the other four runs: their new evaluation; the finished one: its new one (read for the signature that
    # shows the status change), then all 8 afresh
    assert len(converted) == 4 + 1 + 8 and converted.count(0) == 1
