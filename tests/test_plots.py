"""Pure figure builders (engine/figures/, engine/tif_explorer.py): data functions give the right numbers, figures the right traces.

Runs here are synthetic (no training): ``make_run`` fabricates a run record exactly in the store's
shape, with a known MID (the ε=1 tier's loss rises above its start, then recovers).
"""
from __future__ import annotations

import copy
import math
import subprocess
import sys

import numpy as np
import plotly.graph_objects as go
import pytest
from scipy.stats import pearsonr

from engine import tif_explorer
from engine.figures import explorer, frames, scaffold, training
from engine.config import RunConfig
from engine.importance import importance_weights, make_tif
from engine.runs import dp_note, run_label

PAPER = {0: 2, 1: 2, 2: 0, 3: 1, 4: 2, 5: 0, 6: 2, 7: 1, 8: 1, 9: 0}  # class -> tier index (ε = 1, 2, 3)


def make_run(run_id: int, algorithm: str = "ino", *, group: str = "g1", steps=range(0, 101, 10), gain: float = 0.0,
             status: str = "finished", fairness: bool = False, private_quantile: bool = True) -> dict:
    """A run record (store run dict + evals) with paper tiers on digits and a MID in tier ε=1."""
    cfg = RunConfig().replace(**{"algorithm.name": algorithm, "algorithm.private_quantile": private_quantile})
    eps = [1.0, 2.0, 3.0]
    names = ["ε=1", "ε=2", "ε=3"]
    steps = list(steps)
    total = steps[-1]
    evals = []
    for s in steps:
        prog = s / total
        tiers = []
        for k in range(3):
            bump = 0.5 * math.sin(math.pi * min(prog / 0.6, 1.0)) if k == 0 else 0.0  # MID for ε=1 until 60 %
            loss = 2.3 + bump - prog * (0.3 + 0.4 * k)
            recall = min(1.0, prog * (0.3 + 0.3 * k) + (gain if k == 0 else 0.0) * (1 - prog))
            tiers.append({"name": names[k], "epsilon": eps[k], "epsilon_spent": eps[k] * math.sqrt(prog),
                          "loss": loss, "recall": recall, "accuracy": recall, "n": 100})
        classes = [{"name": str(c), "loss": tiers[PAPER[c]]["loss"],
                    "recall": min(1.0, tiers[PAPER[c]]["recall"] + 0.01 * c), "accuracy": 0.9} for c in range(10)]
        e = {"step": s, "epoch": 3 * prog, "elapsed": prog, "tier_split": "test",
             "overall": {"loss": 2.3 - prog, "accuracy": 0.1 + 0.8 * prog, "balanced_accuracy": 0.1 + 0.7 * prog},
             "tiers": tiers, "classes": classes}
        if fairness:
            e["fairness"] = {"demographic_parity_difference": 0.2 * (1 - prog), "equalized_odds_difference": 0.1}
        evals.append(e)
    plan = {"formal_dp": algorithm != "nonprivate" and (algorithm != "dpsgd_s" or private_quantile)}
    return {"id": run_id, "kind": "train", "name": "", "algorithm": algorithm, "group_id": group,
            "config": cfg.to_dict(), "status": status, "error": None, "pid": None, "created_at": 1.0e9 + run_id,
            "started_at": 1.0e9 + run_id, "finished_at": None, "step": total, "total_steps": total, "plan": plan,
            "summary": None, "versions": {}, "evals": evals}


@pytest.fixture()
def pair():
    return [make_run(1, "idp_sample"), make_run(2, "ino", gain=0.2)]


def test_engine_modules_import_without_streamlit():
    code = ("import sys, engine.figures.training, engine.figures.audit, engine.figures.explorer, "
            "engine.tif_explorer, engine.export, engine.jobs; "
            "assert 'streamlit' not in sys.modules, 'engine must not import streamlit'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tier_history_and_mid_spans(pair):
    hist = frames.tier_history(pair)
    assert len(hist) == 2 * 11 * 3
    assert set(hist["tier"]) == {"ε=1", "ε=2", "ε=3"}
    spans = frames.mid_spans(pair)
    t1 = spans[(spans.run_id == 1) & (spans.tier == "ε=1")].iloc[0]
    assert t1["state"] == "recovered" and t1["onset_step"] == 10 and t1["end_step"] == 60
    assert t1["peak_step"] == 30 and t1["peak_increase"] > 0.3
    others = spans[spans.tier != "ε=1"]
    assert set(others["state"]) == {"none"}


def test_mid_spans_from_partial_history_are_ongoing():
    run = make_run(5, "ino", status="running")  # a live run, seen inside its MID window (it ends at step 60)
    run["evals"] = run["evals"][:4]  # steps 0..30
    spans = frames.mid_spans([run])
    t1 = spans[spans.tier == "ε=1"].iloc[0]
    assert t1["state"] == "ongoing" and t1["onset_step"] is not None and pd_isna(t1["end_step"])


def pd_isna(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def test_owner_recall_is_per_class_with_the_class_tier_budget(pair):
    owners = frames.owner_recall(pair)
    assert len(owners) == 20 and set(owners["owner_kind"]) == {"class"}
    row = owners[(owners.run_id == 1) & (owners.owner == "2")].iloc[0]
    assert row["epsilon"] == 1.0 and row["tier"] == "ε=1"
    row = owners[(owners.run_id == 1) & (owners.owner == "0")].iloc[0]
    assert row["epsilon"] == 3.0


def test_pearson_matches_scipy(pair):
    owners = frames.owner_recall(pair)
    stats = frames.pearson_by_run(owners)
    for run_id in (1, 2):
        g = owners[owners.run_id == run_id]
        expect = pearsonr(g["epsilon"], g["recall"])
        got = stats[stats.run_id == run_id].iloc[0]
        assert got["r"] == pytest.approx(expect.statistic) and got["p"] == pytest.approx(expect.pvalue)
        assert got["n"] == 10


def test_recall_gain_pairs_ino_with_idp(pair):
    gain = frames.recall_gain_by_class(pair)
    assert len(gain) == 10
    assert set(gain["pair"]) == {"INO #2 − IDP-SGD (SAMPLE) #1"}
    # final recalls are equal by construction (the gain fades to 0 at the end)
    assert np.allclose(gain["gain"], 0.0, atol=1e-9)
    over_time = frames.recall_gain_over_time(pair)
    t1 = over_time[over_time.tier == "ε=1"].sort_values("step")
    assert t1["gain"].iloc[0] == pytest.approx(0.2)  # the early gain (MID window)...
    assert t1["gain"].iloc[-1] == pytest.approx(0.0)  # ...fades by the end
    assert set(over_time[over_time.tier != "ε=1"]["gain"].round(12)) == {0.0}


def test_no_pair_gives_empty_frames_and_explanatory_figures():
    runs = [make_run(1, "dpsgd")]
    assert frames.recall_gain_by_class(runs).empty
    fig = training.fig_recall_gain_by_class(frames.recall_gain_by_class(runs))
    assert isinstance(fig, go.Figure) and len(fig.data) == 0 and fig.layout.annotations


def test_recall_auc_matches_trapezoid(pair):
    auc = frames.recall_auc_table(pair)
    run = pair[0]
    steps = np.array([e["step"] for e in run["evals"]], float)
    rec = np.array([e["tiers"][2]["recall"] for e in run["evals"]])
    expect = np.trapezoid(rec, steps / steps[-1])
    got = auc[(auc.run_id == 1) & (auc.tier == "ε=3")]["recall_auc"].iloc[0]
    assert got == pytest.approx(expect)
    assert ((auc["recall_auc"] >= 0) & (auc["recall_auc"] <= 1)).all()


def _keys(fig, prefix: str) -> list[str]:
    return [t.meta for t in fig.data if str(t.meta).startswith(prefix)]


def test_mid_curves_facets_and_shading(pair):
    hist = frames.tier_history(pair)
    fig = training.fig_mid_curves(hist)
    assert {a.text for a in fig.layout.annotations} >= {"IDP-SGD (SAMPLE) #1", "INO-SGD #2"}
    shaded = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(shaded) == 2  # one MID span (ε=1) per run
    assert shaded[0].x0 == 10 and shaded[0].x1 == 60
    assert len(_keys(fig, "line|")) == 6 and len(_keys(fig, "initial|")) == 6
    assert fig.layout.yaxis.matches is None and fig.layout.yaxis2.matches is None  # each facet its own y axis
    overlay = training.fig_mid_curves(hist, layout="overlay")
    # one panel: the most private tier of each run (IDP and INO), the other tiers faint
    assert _keys(overlay, "line|") == ["line|IDP-SGD (SAMPLE) #1|ε=1", "line|INO-SGD #2|ε=1"]
    assert len(_keys(overlay, "faint|")) == 4
    assert len([s for s in overlay.layout.shapes if s.type == "rect"]) == 2
    assert "ε=1" in overlay.layout.title.text


def test_epsilon_spent_has_budget_lines_and_dp_notes():
    runs = [make_run(1, "idp_sample"), make_run(2, "dpsgd_s", private_quantile=False)]
    hist = frames.tier_history(runs)
    notes = {run_label(r): dp_note(r) for r in runs}
    fig = training.fig_epsilon_spent(hist, notes=notes)
    budgets = [t for t in fig.data if t.name and t.name.endswith("budget")]
    assert len(budgets) == 6 and {t.y[0] for t in budgets} == {1.0, 2.0, 3.0}
    titles = {a.text for a in fig.layout.annotations}
    assert "DP-SGD-S #2 — no formal DP guarantee" in titles
    assert dp_note(runs[0]) == "" and dp_note(make_run(3, "nonprivate")).startswith("non-private")


def test_build_figures_all_names_and_themes(pair):
    runs = pair + [make_run(3, "dpsgd", fairness=True)]
    for theme in scaffold.THEMES:
        specs = training.build_figures(runs, theme=theme)
        assert [s.name for s in specs] == list(training.LIVE_FIGURES + training.RESULT_FIGURES)
        for s in specs:
            assert isinstance(s.figure, go.Figure) and s.title
            assert not s.data.empty, s.name
    dark = training.build_figures(runs, theme="dark", names=["accuracy"])[0].figure
    assert dark.layout.template.layout.paper_bgcolor == "#0e1117"
    big = training.build_figures(runs, theme="presentation", names=["accuracy"])[0].figure
    assert big.layout.template.layout.font.size == 20
    with pytest.raises(ValueError):
        training.build_figures(runs, names=["nope"])
    with pytest.raises(ValueError):
        scaffold.template("neon")


def test_builders_do_not_mutate_their_inputs(pair):
    before = copy.deepcopy(pair)
    training.build_figures(pair)
    assert pair == before
    hist = frames.tier_history(pair)
    snapshot = hist.copy()
    training.fig_tier_recall(hist)
    training.fig_epsilon_spent(hist)
    assert hist.equals(snapshot)


def test_empty_selection_and_runs_without_evals():
    specs = training.build_figures([])
    assert all(isinstance(s.figure, go.Figure) for s in specs)
    queued = make_run(9, "ino", status="queued")
    queued["evals"] = []
    specs = training.build_figures([queued], names=training.LIVE_FIGURES)
    assert all(len(s.figure.data) == 0 for s in specs)


def test_fairness_and_final_tables():
    runs = [make_run(1, "dpsgd", fairness=True), make_run(2, "ino")]
    fair = frames.fairness_table(runs)
    assert set(fair["run_id"]) == {1} and len(fair) == 2
    final = frames.final_table(runs)
    assert list(final["accuracy"]) == pytest.approx([0.9, 0.9])
    fig = training.fig_overall_bars(final)
    assert len(fig.data) == 2
    table = frames.mid_summary(runs)
    assert {"MID", "onset step", "end step", "recall AUC"} <= set(table.columns)
    assert len(table) == 6


def test_explorer_batch_weights_match_the_engine():
    rng = np.random.default_rng(0)
    losses = rng.exponential(1.0, 40)
    clip = rng.choice([0.5, 1.0, 2.0], 40)
    tiers = rng.integers(0, 3, 40)
    tif = make_tif("beta", alpha=2.0, beta=1.0)
    batch = tif_explorer.explorer_batch(losses, clip, tiers, ["a", "b", "c"], [1.0, 2.0, 3.0], tif=tif, tail_length=10.0)
    expect = importance_weights(losses, clip, tail_length=10.0, alpha=2.0, beta=1.0)
    assert np.allclose(batch.sort_values("item")["rho"].to_numpy(), expect)
    assert (np.diff(batch["loss"].to_numpy()) >= 0).all()  # laid out in loss order
    assert batch["mass_end"].iloc[-1] == pytest.approx(clip.sum())
    table = tif_explorer.explorer_tier_table(batch)
    assert table["items"].sum() == 40
    dropped = ((1 - batch["rho"]) * batch["clip_norm"]).sum()
    assert dropped == pytest.approx(10.0 * tif.dropped_fraction)  # γ·α/(α+β) once the batch exceeds γ
    assert tif.dropped_fraction == pytest.approx(2.0 / 3.0)
    for fig in (explorer.fig_tif(tif), explorer.fig_bif_batch(batch, tif, 10.0), explorer.fig_tier_rho(table)):
        assert isinstance(fig, go.Figure) and fig.data


def test_explorer_sample_on_digits():
    from engine.data import load_dataset
    from engine.tiers import preset

    ds = load_dataset("digits")
    sample = tif_explorer.explorer_sample(ds, preset("paper", ds), batch_size=64, seed=1)
    n = len(sample["losses"])
    assert 20 < n < 140 and len(sample["clip_norms"]) == n and len(sample["tiers"]) == n
    assert (sample["losses"] >= 0).all() and np.isfinite(sample["losses"]).all()
    assert sample["expected_clip_mass"] == pytest.approx(64.0, rel=1e-3)  # SAMPLE: Σ q N C = B·C
    again = tif_explorer.explorer_sample(ds, preset("paper", ds), batch_size=64, seed=1)
    assert np.array_equal(again["batch_indices"], sample["batch_indices"])


# --- user text is escaped in every figure (issue 9 §6) ---------------------------------------------------

HOSTILE = '<a href="http://x">click</a><b>%{fullData.name}'
ESCAPED = '&lt;a href="http://x"&gt;click&lt;/a&gt;&lt;b&gt;'


def _strings(x):
    """Every string in a figure dict (template excluded: it holds no user text)."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for k, v in x.items():
            if k != "template":
                yield from _strings(v)
    elif isinstance(x, (list, tuple, np.ndarray)):
        for v in x:
            yield from _strings(v)


def assert_escaped(fig: go.Figure, what: str) -> None:
    texts = list(_strings(fig.to_dict()))
    raw = [t for t in texts if "<a" in t or "</a>" in t or "<b>" in t or "%{fullData" in t]
    assert not raw, (what, raw[:3])
    assert any(ESCAPED in t for t in texts), (what, "the user text is not shown at all")
    assert not [t for t in texts if "&amp;lt;" in t or "&amp;gt;" in t], (what, "escaped twice")


def hostile_run(run_id: int, algorithm: str) -> dict:
    """A run whose name, tier names and class names are all markup."""
    run = make_run(run_id, algorithm, fairness=True)
    run["name"] = HOSTILE
    for e in run["evals"]:
        for k, t in enumerate(e["tiers"]):
            t["name"] = f"{HOSTILE} tier {k}"
        for c, m in enumerate(e["classes"]):
            m["name"] = f"{HOSTILE} class {c}"
    return run


def test_user_text_is_escaped_in_every_training_figure():
    runs = [hostile_run(1, "idp_sample"), hostile_run(2, "ino")]
    assert run_label(runs[0]) == f"{HOSTILE} #1"  # labels stay raw text: the figures escape
    for layout in ("facet", "overlay"):
        for spec in training.build_figures(runs, mid_layout=layout):
            assert_escaped(spec.figure, spec.name)
    data = training.build_figures(runs, names=["accuracy"])[0].data
    assert set(data["run"]) == {f"{HOSTILE} #1", f"{HOSTILE} #2"}  # the CSV keeps what the user wrote
    notes = {run_label(r): "no formal DP guarantee" for r in runs}
    assert_escaped(training.fig_epsilon_spent(frames.tier_history(runs), notes=notes), "epsilon_spent with notes")
    err = scaffold.empty_figure(HOSTILE, "light", f"failed: {HOSTILE}")
    assert_escaped(err, "empty figure (error text)")
    assert err.layout.title.text == scaffold.esc(HOSTILE)


def test_user_text_is_escaped_in_the_explorer_figures():
    rng = np.random.default_rng(0)
    names = [f"{HOSTILE} {k}" for k in range(3)]
    tif = make_tif("beta", alpha=2.0, beta=1.0)
    batch = tif_explorer.explorer_batch(rng.exponential(1.0, 30), np.ones(30), rng.integers(0, 3, 30), names,
                                        [1.0, 2.0, 3.0], tif=tif, tail_length=10.0)
    assert_escaped(explorer.fig_bif_batch(batch, tif, 10.0), "bif_batch")
    assert_escaped(explorer.fig_tier_rho(tif_explorer.explorer_tier_table(batch)), "tier_rho")


def hostile_audit() -> dict:
    """An audit results dict (the store's summary shape) whose group, tier and algorithm names are markup."""
    groups = [f"{HOSTILE} g{k}" for k in range(2)]
    algos = []
    for k, name in enumerate(("dpsgd", "nonprivate")):
        algos.append({
            "key": f"{name}-{k}", "name": name, "label": f"{HOSTILE} {name}", "formal_dp": name == "dpsgd",
            "null_floor": 0.05,
            "gpr": {"groups": {g: {"mean": 0.1 + 0.1 * j, "low": 0.05, "high": 0.3} for j, g in enumerate(groups)},
                    "delta": {"value": 10.0, "low": 2.0, "high": 18.0}},
            "accuracy": {"mean": 0.8, "std": 0.01, "min": 0.78, "max": 0.82, "groups": {g: 0.8 for g in groups}},
            "epsilon": {"tiers": [{"name": f"{HOSTILE} tier", "claimed": 1.0, "target": 1.0, "lower_bound": 0.3,
                                   "tpr": 0.2, "fpr": 0.1}], "confidence": 0.95},
            "lira": {"groups": {g: {"auc": 0.6, "tpr_at_0.1%": 0.01, "tpr_at_1%": 0.05} for g in groups},
                     "roc": {g: {"fpr": [1e-4, 0.1, 1.0], "tpr": [1e-3, 0.2, 1.0]} for g in groups}},
            "histogram": {"edges": [0.0, 0.5, 1.0], "counts": {g: [3, 1] for g in groups}},
            "baselines": {"pa_ga": 0.1, "pa_gba": {g: 0.12 for g in groups}, "looa_models_per_record": 4,
                          "pa_looa": [{"index": 3, "group": groups[0], "aloo_advantage": 0.2, "looa_advantage": 0.1}]},
        })
    return {"algorithms": algos, "group_names": groups, "group_sizes": {g: 10 for g in groups},
            "threshold": "in_sample", "n_models": 4, "n_train": 20, "group_by": "attribute",
            "config": {"group_attribute": HOSTILE}}


def test_user_text_is_escaped_in_every_audit_figure():
    from engine.figures.audit import AUDIT_FIGURES, build_audit_figures

    specs = build_audit_figures(hostile_audit())
    assert [s.name for s in specs] == list(AUDIT_FIGURES)
    for spec in specs:
        assert not spec.data.empty, spec.name
        assert_escaped(spec.figure, spec.name)


def test_dataset_name_of_runs_and_audits_old_and_new():
    from engine.audit.config import AuditConfig
    from engine.runs import dataset_name

    assert dataset_name(make_run(1, "ino")) == "digits"
    audit = {"id": 2, "kind": "audit", "config": AuditConfig().replace(**{"run.data.name": "digits"}).to_dict()}
    assert dataset_name(audit) == "digits"
    flat = {"id": 3, "kind": "audit", "config": {"dataset": "digits", "R": 3}}  # an older store's flat audit config
    assert dataset_name(flat) == "digits"
    assert dataset_name({"id": 4, "kind": "train", "config": {"epochs": "many"}}) is None  # unreadable: no crash
