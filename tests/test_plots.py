"""Pure figure builders (engine/figures/, engine/tools/tif_explorer.py): data functions give the right numbers, figures the right traces.

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

from engine.config.run import RunConfig
from engine.dp.importance import importance_weights, make_tif
from engine.figures import explorer, frames, scaffold, training
from engine.jobs.runs import dp_note, run_label
from engine.tools import tif_explorer

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


@pytest.mark.slow
def test_engine_modules_import_without_streamlit():
    code = ("import sys, engine.figures.training, engine.figures.audit, engine.figures.explorer, "
            "engine.tools.tif_explorer, engine.figures.export, engine.jobs.manager; "
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_explorer_sample_on_digits():
    from engine.data import load_dataset
    from engine.dp.tiers import preset

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


@pytest.mark.slow
def test_user_text_is_escaped_in_every_training_figure():
    runs = [hostile_run(1, "idp_sample"), hostile_run(2, "ino")]
    assert run_label(runs[0]) == f"{HOSTILE} #1"  # labels stay raw text: the figures escape
    for layout in ("facet", "overlay"):
        for spec in training.build_figures(runs, mid_layout=layout):
            assert_escaped(spec.figure, spec.name)
    seeded = [hostile_run(11 + j, algo) for algo in ("idp_sample", "ino") for j in range(2)]
    for j, run in enumerate(seeded):
        run["config"].update(seed=j % 2, seeds=2, seed_index=j % 2)
        run["id"] += 8 * (run["algorithm"] == "ino")
    for e in seeded[-1]["evals"][5:]:
        e["tiers"][1]["loss"] = float("inf")  # a diverged run: its badge names it in the overlay
    options = [dict(mid_layout="overlay", smoothing=0.5, x_axis="epsilon"), dict(x_axis="epoch", bands=False)]
    for opts in options:
        for spec in training.build_figures(seeded, names=list(training.LIVE_FIGURES) + ["recall_gain_time",
                                                                                      "gain_spread"], **opts):
            assert_escaped(spec.figure, f"{spec.name} {opts}")
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
    est = {"value": -1.0, "low": -2.0, "high": -0.5}
    comparisons = [{"a": algos[0]["key"], "b": algos[1]["key"], "a_label": algos[0]["label"],
                    "b_label": algos[1]["label"], "delta": est, "delta_unpaired": est,
                    "groups": {g: est for g in groups}, "reference_gpr": {g: 0.1 for g in groups}, "accuracy": est,
                    "n_boot": 10, "ci": 0.95}]
    return {"algorithms": algos, "group_names": groups, "group_sizes": {g: 10 for g in groups},
            "threshold": "in_sample", "n_models": 4, "n_train": 20, "group_by": "attribute",
            "config": {"group_attribute": HOSTILE}, "comparisons": comparisons}


def test_user_text_is_escaped_in_every_audit_figure():
    from engine.figures.audit import AUDIT_FIGURES, build_audit_figures

    specs = build_audit_figures(hostile_audit())
    assert [s.name for s in specs] == list(AUDIT_FIGURES)
    for spec in specs:
        assert not spec.data.empty, spec.name
        assert_escaped(spec.figure, spec.name)


def test_dataset_name_of_runs_and_audits_old_and_new():
    from engine.audit.pa_alooa.config import AuditConfig
    from engine.jobs.runs import dataset_name

    assert dataset_name(make_run(1, "ino")) == "digits"
    audit = {"id": 2, "kind": "audit", "config": AuditConfig().replace(**{"run.data.name": "digits"}).to_dict()}
    assert dataset_name(audit) == "digits"
    flat = {"id": 3, "kind": "audit", "config": {"dataset": "digits", "R": 3}}  # an older store's flat audit config
    assert dataset_name(flat) == "digits"
    assert dataset_name({"id": 4, "kind": "train", "config": {"epochs": "many"}}) is None  # unreadable: no crash


# --- readable curves: independent y, divergence, legends, palettes, smoothing, x axes (issue 10 §3) ------------

def seed_series(first_id: int, algorithm: str, k: int, *, offsets, gains=None, group: str = "gs", base_seed: int = 7,
                steps=range(0, 101, 10)) -> list[dict]:
    """k run rows of one seed series (as the store holds them: one row per seed, config.seed_index = j):
    seed j's recalls are shifted by offsets[j], its ε=1 tier's recall by gains[j] more."""
    runs = []
    for j in range(k):
        run = make_run(first_id + j, algorithm, group=group, steps=steps)
        run["config"].update(seed=base_seed + j, seeds=k, seed_index=j)
        for e in run["evals"]:
            for t, tier in enumerate(e["tiers"]):
                tier["recall"] += offsets[j] + (gains[j] if gains is not None and t == 0 else 0.0)
                tier["loss"] += offsets[j]
        runs.append(run)
    return runs


def _trace(fig, key: str):
    found = [t for t in fig.data if t.meta == key]
    assert len(found) == 1, (key, [t.meta for t in fig.data])
    return found[0]


def test_series_labels_and_seed_columns():
    runs = seed_series(11, "idp_sample", 3, offsets=[0, 0, 0]) + [make_run(20, "ino")]
    assert frames.series_label(runs[1]) == "IDP-SGD (SAMPLE) #11–13"
    assert frames.series_label(runs[3]) == run_label(runs[3])  # a single-seed run is its own series

    for frame in (frames.tier_history(runs), frames.class_history(runs), frames.overall_history(runs),
                  frames.mid_spans(runs), frames.owner_recall(runs), frames.recall_auc_table(runs),
                  frames.final_table(runs), frames.pearson_by_run(frames.owner_recall(runs))):
        assert {"seed", "series"} <= set(frame.columns)
        by_run = frame.drop_duplicates("run_id").set_index("run_id")
        assert list(by_run.loc[[11, 12, 13], "seed"]) == [7, 8, 9]
        assert set(by_run.loc[[11, 12, 13], "series"]) == {"IDP-SGD (SAMPLE) #11–13"}
        assert by_run.loc[20, "series"] == "INO-SGD #20"


def test_seed_bands_are_mean_and_standard_error():
    offsets = [0.0, 0.02, 0.07]
    runs = seed_series(11, "idp_sample", 3, offsets=offsets)
    fig = training.fig_tier_recall(frames.tier_history(runs))
    key = "IDP-SGD (SAMPLE) #11–13|ε=3"
    line, lo, hi = _trace(fig, f"line|{key}"), _trace(fig, f"lo|{key}"), _trace(fig, f"hi|{key}")
    per_seed = np.array([[e["tiers"][2]["recall"] for e in r["evals"]] for r in runs])
    se = per_seed.std(axis=0, ddof=1) / np.sqrt(3)
    assert np.allclose(line.y, per_seed.mean(axis=0)) and np.allclose(np.asarray(hi.y) - line.y, se)
    assert np.allclose(line.y - np.asarray(lo.y), se) and hi.fill == "tonexty"
    assert "± 1 SE over seeds (band)" in {t.name for t in fig.data}
    mid = training.fig_mid_curves(frames.tier_history(runs))
    assert [a.text for a in mid.layout.annotations][:1] == ["IDP-SGD (SAMPLE) #11–13"]  # one facet per series
    assert _trace(mid, "hi|IDP-SGD (SAMPLE) #11–13|ε=1")
    separate = training.fig_tier_recall(frames.tier_history(runs), bands=False)
    assert len([t for t in separate.data if str(t.meta).startswith("line|")]) == 9 and not any(
        str(t.meta).startswith("hi|") for t in separate.data)


def test_gain_is_paired_by_seed_index_and_judged_against_the_seed_spread():
    offsets, gains = [0.0, 0.05, -0.04, 0.02], [0.10, 0.12, 0.09, 0.11]
    runs = seed_series(11, "idp_sample", 4, offsets=offsets) + seed_series(21, "ino", 4, offsets=offsets, gains=gains)
    gain = frames.recall_gain_over_time(runs)
    t1 = gain[gain.tier == "ε=1"]
    assert set(zip(t1["ino_run_id"], t1["idp_run_id"])) == {(21, 11), (22, 12), (23, 13), (24, 14)}
    for j, g in enumerate(gains):  # replicate j against replicate j: the offsets cancel exactly
        assert np.allclose(t1[t1.seed_index == j]["gain"], g)
    from engine.figures import bands

    spread = bands.recall_gain_spread(gain)
    row = spread[(spread.tier == "ε=1") & (spread.step == 50)].iloc[0]
    assert row["n"] == 4 and row["mean_gain"] == pytest.approx(np.mean(gains))
    assert row["se"] == pytest.approx(np.std(gains, ddof=1) / 2) and row["beyond_spread"] and row["p"] < 0.01
    assert not spread[spread.tier == "ε=3"]["beyond_spread"].any()  # gain exactly 0 there
    words = bands.gain_spread_words(spread)
    assert words[0].startswith("ε=1 (INO-SGD #21–24 − IDP-SGD (SAMPLE) #11–14): gain +10.5 points averaged over "
                               "training, ± 0.6 points (s.e. over 4 paired seeds)")
    assert "beyond the seed spread (mean − 2·SE > 0) at 11 of 11 evaluations" in words[0]
    assert "not beyond the seed spread" in words[-1]
    fig = training.fig_recall_gain_over_time(gain)
    line = _trace(fig, "line|INO-SGD #21–24 − IDP-SGD (SAMPLE) #11–14|ε=1")
    assert np.allclose(line.y, 100 * np.mean(gains))  # in recall points (pp), as the words below it
    note = [a for a in fig.layout.annotations if a.name == "gain_spread"][0]
    assert "beyond the seed spread" in note.text
    noisy = seed_series(31, "ino", 4, offsets=offsets, gains=[0.2, -0.2, 0.15, -0.1], group="gs2") + \
        seed_series(41, "idp_sample", 4, offsets=offsets, group="gs2")
    words = bands.gain_spread_words(bands.recall_gain_spread(frames.recall_gain_over_time(noisy)))
    assert "not beyond the seed spread" in words[0]


def diverged_run(run_id: int, at_step: int = 50) -> dict:
    run = make_run(run_id, "ino")
    for e in run["evals"]:
        if e["step"] >= at_step:
            for t in e["tiers"]:
                t["loss"] = 1e6 if e["step"] < 80 else float("nan")
    return run


def test_diverged_run_is_clipped_and_badged_and_the_other_facets_stay_readable():
    runs = [make_run(1, "idp_sample"), diverged_run(2)]
    fig = training.fig_mid_curves(frames.tier_history(runs))
    badges = [a for a in fig.layout.annotations if a.name == "diverged"]
    assert [(a.text, a.xref, a.yref) for a in badges] == [("diverged", "x2 domain", "y2 domain")]
    lo, hi = fig.layout.yaxis2.range
    assert hi < 5 and lo > 0.5  # the diverged facet is clipped to its curve before divergence
    assert fig.layout.yaxis.range is None and fig.layout.yaxis.matches is None  # IDP's facet: its own autorange
    overlay = training.fig_mid_curves(frames.tier_history(runs), layout="overlay")
    assert [a.text for a in overlay.layout.annotations if a.name == "diverged"] == ["diverged: INO-SGD #2"]
    assert overlay.layout.yaxis.range[1] < 5


def test_divergence_rule():
    from engine.models.metrics import diverged_at, diverged_step

    assert diverged_step([0, 1, 2], [2.0, 19.0, 19.5]) is None  # 9.75× its start: not diverged
    assert diverged_step([0, 1, 2], [2.0, 21.0, 25.0]) == 1  # above 10× and stays there
    assert diverged_step([0, 1, 2, 3], [2.0, 21.0, 2.0, 22.0]) == 3  # the final stretch above 10× starts at 3
    assert diverged_step([0, 1, 2], [2.0, 21.0, 2.0]) is None  # a spike the optimizer recovered from
    assert diverged_step([0, 1, 2], [2.0, 2.1, float("inf")]) == 2
    assert diverged_step([0, 1, 2], [2.0, float("nan"), 2.0]) == 1  # non-finite: at once
    assert diverged_step([0, 10, 20], [0.0, 1e-13, 1e-10]) == 20  # a zero start: the factor of a tiny floor
    assert diverged_step([0, 1, 2, 3], [2.0, 30.0, 1e6, float("nan")]) == 1  # above, then non-finite: one stretch
    assert diverged_step([], []) is None and diverged_step([0, 1], [float("nan")] * 2) is None  # no samples: no curve
    assert diverged_step([0, 1], [2.0, None]) == 1  # a loss not recorded (None) is not finite
    assert diverged_at([0, 1, 2], [[2.0, 1.0], [2.1, 11.0], [2.0, 12.0]]) == 1  # any tier
    assert diverged_at([0, 1, 2], [[2.0, 1.0], [2.1, 1.0], [2.0, 1.2]]) is None


def test_every_mark_has_a_legend_entry(pair):
    hist = frames.tier_history(pair)
    names = {t.name for t in training.fig_mid_curves(hist, smoothing=0.5).data if t.showlegend is not False}
    assert {"initial loss (dotted)", "MID span: loss above its initial value (shaded)", "ε=1", "ε=2", "ε=3"} <= names
    assert any(n.startswith("raw (faint") for n in names)
    eps = {t.name for t in training.fig_epsilon_spent(hist).data if t.showlegend is not False}
    assert "budget ε (dashed)" in eps


def test_tier_colours_are_colour_blind_safe_and_apart_from_algorithm_colours():
    assert scaffold.TIER_COLORS[0] == "#D55E00"  # the most private tier: Okabe–Ito vermillion, most salient
    tiers = {c.lower() for c in scaffold.TIER_COLORS}
    algos = {c.lower() for c in (*scaffold.ALGORITHM_COLORS.values(), *scaffold.EXTRA_COLORS)}
    assert not tiers & algos
    assert len(set(scaffold.ALGORITHM_SYMBOLS.values())) == len(scaffold.ALGORITHM_SYMBOLS)


def test_smoothing_draws_the_ema_and_the_raw_curve_faint(pair):
    hist = frames.tier_history(pair)
    fig = training.fig_tier_recall(hist, smoothing=0.6)
    raw, line = _trace(fig, "raw|INO-SGD #2|ε=1"), _trace(fig, "line|INO-SGD #2|ε=1")
    y = [e["tiers"][0]["recall"] for e in pair[1]["evals"]]
    expect = [y[0]]
    for v in y[1:]:
        expect.append(0.6 * expect[-1] + 0.4 * v)
    assert np.allclose(raw.y, y) and np.allclose(line.y, expect) and raw.opacity < 0.5
    for bad in (-0.1, 0.99, 1.5):
        with pytest.raises(ValueError, match="smoothing"):
            training.build_figures(pair, smoothing=bad)


@pytest.mark.slow
def test_x_axes_step_epoch_wall_time_and_epsilon():
    runs = [make_run(1, "idp_sample"), make_run(2, "nonprivate")]
    for r in runs[1:]:
        for e in r["evals"]:
            for t in e["tiers"]:
                t["epsilon_spent"] = None  # no formal guarantee: ε spent is null
    hist = frames.tier_history(runs)
    evals = runs[0]["evals"]
    for axis, values, title in (("epoch", [e["epoch"] for e in evals], "epoch"),
                                ("elapsed", [e["elapsed"] for e in evals], "wall time (s)")):
        fig = training.fig_tier_recall(hist, x_axis=axis)
        assert np.allclose(_trace(fig, "line|IDP-SGD (SAMPLE) #1|ε=2").x, values) and fig.layout.xaxis.title.text == title
    fig = training.fig_tier_recall(hist, x_axis="epsilon")
    assert np.allclose(_trace(fig, "line|IDP-SGD (SAMPLE) #1|ε=2").x, [e["tiers"][1]["epsilon_spent"] for e in evals])
    assert fig.layout.xaxis.title.text == "ε spent (each tier's own)"
    note = [a.text for a in fig.layout.annotations if "not on this x axis" in (a.text or "")]
    assert note and "Non-private SGD #2" in note[0]  # said in the figure, not a crash
    acc = training.fig_accuracy(frames.overall_history(runs), x_axis="epsilon")
    assert acc.layout.xaxis.title.text == "ε spent of the most private tier"
    assert np.allclose(_trace(acc, "line|IDP-SGD (SAMPLE) #1|").x, [e["tiers"][0]["epsilon_spent"] for e in evals])
    only = training.build_figures(runs[1:], names=["mid_curves"], x_axis="epsilon")[0].figure
    assert len(only.data) == 0 and "no ε spent recorded" in only.layout.annotations[0].text
    for name in training.LIVE_FIGURES + ("recall_gain_time",):
        for axis in ("step", "epoch", "elapsed", "epsilon"):
            assert isinstance(training.build_figures(runs, names=[name], x_axis=axis)[0].figure, go.Figure)
    with pytest.raises(ValueError, match="x axis"):
        training.build_figures(runs, x_axis="time")


def test_overlay_is_the_most_private_tier_of_idp_and_ino_on_one_panel(pair):
    fig = training.build_figures(pair, names=["mid_curves"], mid_layout="overlay")[0].figure
    lines = [t for t in fig.data if str(t.meta).startswith("line|")]
    assert [t.name for t in lines] == ["IDP-SGD (SAMPLE) #1 · ε=1", "INO-SGD #2 · ε=1"]
    assert [t.line.color for t in lines] == [scaffold.ALGORITHM_COLORS["idp_sample"], scaffold.ALGORITHM_COLORS["ino"]]
    assert "xaxis2" not in fig.layout and "other tiers (faint)" in {t.name for t in fig.data}


def test_lone_runs_that_differ_only_in_their_seed_form_one_series_paired_by_seed():
    """Lone runs of one group (ids interleaved: IDP 1, 3, 5 and INO 2, 4, 6, seeds 0, 1, 2): one series per
    algorithm, labelled by its members' ids, and INO of seed s pairs with IDP of seed s."""
    runs = []
    for j in range(3):
        for rid, algo in ((2 * j + 1, "idp_sample"), (2 * j + 2, "ino")):
            run = make_run(rid, algo)
            run["config"] = {**run["config"], "seed": j}
            runs.append(run)
    labels = frames.series_labels(runs)
    assert {labels[i] for i in (1, 3, 5)} == {"IDP-SGD (SAMPLE) #1, #3, #5"}
    assert {labels[i] for i in (2, 4, 6)} == {"INO-SGD #2, #4, #6"}
    assert sorted((ino["id"], idp["id"]) for ino, idp in frames.pair_runs(runs)) == [(2, 1), (4, 3), (6, 5)]


def test_mean_se_is_the_seed_bands_rule_for_one_group():
    """One owner of the standard error: the seed bands' (sample sd / √n), for the talk figures and the experiments."""
    import pandas as pd

    from engine.figures.bands import mean_se, seed_mean

    values = [0.1, 0.4, None, float("nan"), 0.7]
    mean, se, n = mean_se(values)
    assert n == 3 and mean == pytest.approx(0.4) and se == pytest.approx(np.std([0.1, 0.4, 0.7], ddof=1) / np.sqrt(3))
    band = seed_mean(pd.DataFrame({"k": [0, 0, 0], "v": [0.1, 0.4, 0.7]}), ["k"], "v")
    assert band["se"].iloc[0] == pytest.approx(se)
    one = mean_se([2.0])
    assert one[0] == 2.0 and math.isnan(one[1]) and one[2] == 1
    assert math.isnan(mean_se([])[0]) and mean_se([])[2] == 0


def test_gpr_bars_of_different_algorithms_sit_side_by_side_with_their_own_null_floor():
    from engine.figures.audit import fig_gpr_bars

    fig = fig_gpr_bars(hostile_audit())
    bars = [t for t in fig.data if t.type == "bar"]
    floors = [t for t in fig.data if t.type == "scatter" and t.x is not None and t.x[0] is not None]
    assert fig.layout.barmode == "group" and len(bars) == 2
    assert len({b.offsetgroup for b in bars}) == len(bars) and all(b.offsetgroup for b in bars)  # not stacked
    assert {f.offsetgroup for f in floors} == {b.offsetgroup for b in bars}  # each floor tick on its own bar


def test_a_narrow_column_wraps_a_long_title_on_a_copy_and_keeps_short_ones():
    title = "Recall of the most private tier over steps (shaded: MID window, loss above its start) & more"
    fig = scaffold.base_figure(title, "light")
    wrapped = scaffold.wrap_title(fig, 40)
    lines = wrapped.layout.title.text.split("<br>")
    assert len(lines) >= 3 and all(len(line) <= 40 for line in lines)
    assert " ".join(lines) == fig.layout.title.text  # every word kept, in order, escaping intact ("&amp;")
    assert "&amp;" in wrapped.layout.title.text
    assert wrapped.layout.margin.t > (fig.layout.margin.t or 80) - 1  # room for the extra lines
    assert "<br>" not in fig.layout.title.text  # the exported figure keeps its one line
    # plotly.js draws a multi-line title's first lines above where a one-line title sits: the copy moves it down
    assert wrapped.layout.title.y < fig.layout.title.y
    short = scaffold.base_figure("Accuracy", "light")
    assert scaffold.wrap_title(short, 40) is short


def test_notes_below_a_plot_keep_its_height_and_a_narrow_column_grows_the_figure_for_them():
    sentence = "ε=1 (INO #4 − IDP-SGD (SAMPLE) #3): best gain +8.2 points at step 90; one seed, so the spread is unknown."
    note, layout = scaffold.notes_below([sentence, sentence], plot_px=300, top_px=80)
    assert layout["height"] - layout["margin"]["t"] - layout["margin"]["b"] == 300  # the plot's own height
    assert note["y"] < 0 and note["yanchor"] == "top" and note["text"].count("<br>") == 1
    assert scaffold.notes_below([], plot_px=300)[0] is None
    fig = scaffold.base_figure("Gain", "light")
    fig.add_annotation(**note)
    fig.update_layout(**layout)
    narrow = scaffold.wrap_title(fig, 40, note_width=60)
    lines = narrow.layout.annotations[0].text.split("<br>")
    assert len(lines) == 4 and " ".join(lines) == " ".join([sentence, sentence])
    grown = 2 * scaffold.NOTE_LINE_PX
    assert narrow.layout.height == layout["height"] + grown and narrow.layout.margin.b == layout["margin"]["b"] + grown
    assert narrow.layout.margin.t == 80  # nothing above the plot moved
    assert fig.layout.height == layout["height"]  # the exported figure is unchanged


def test_a_narrow_column_wraps_the_notes_above_a_plot_and_makes_room_for_them():
    sentence = "ε=1 (INO #4 − IDP-SGD (SAMPLE) #3): best gain +8.2 points at step 90; one seed, so the spread is unknown."
    fig = scaffold.base_figure("Gain", "light")
    fig.add_annotation(text="<br>".join([sentence, sentence]), xref="paper", yref="paper", x=0, y=1.0,
                       xanchor="left", yanchor="bottom", showarrow=False)
    fig.add_annotation(text=sentence, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False)  # inside: kept
    fig.update_layout(margin_t=122)
    narrow = scaffold.wrap_title(fig, 40, note_width=60)
    lines = narrow.layout.annotations[0].text.split("<br>")
    assert len(lines) == 4 and all(len(line) <= 60 for line in lines)
    assert " ".join(lines) == " ".join([sentence, sentence])
    assert narrow.layout.annotations[1].text == sentence
    assert narrow.layout.margin.t == 122 + 2 * scaffold.ANNOTATION_LINE_PX
    assert fig.layout.annotations[0].text.count("<br>") == 1  # the exported figure is unchanged
    assert scaffold.wrap_title(fig, 40, note_width=200) is fig


@pytest.mark.parametrize("theme", scaffold.THEMES)
def test_a_new_figure_is_what_plotly_validates_it_to(theme):
    """base_figure builds a new figure from the template's stored JSON without validating it again: the same
    figure as Plotly's validated path, for both legends and as the base of a facet grid; a figure's change to its
    own template stays its own."""
    from plotly.subplots import make_subplots

    def validated(fig, legend):
        fig.update_layout(template=scaffold.template(theme), title=dict(text=scaffold.esc("A <b>title</b>"), x=0.01,
                                                                        xanchor="left", y=0.98, yanchor="top"))
        if legend == "top":
            fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.02, x=1, xanchor="right"))
        return fig.to_plotly_json()

    for legend in ("bottom", "top"):
        assert scaffold.base_figure("A <b>title</b>", theme, legend=legend).to_plotly_json() == validated(go.Figure(),
                                                                                                          legend)
        grid, _, _ = scaffold.facet_grid(["a", "b", "c"], "A <b>title</b>", theme, max_cols=2, legend=legend)
        plain = make_subplots(rows=2, cols=2, subplot_titles=["a", "b", "c"], shared_yaxes=True,
                              horizontal_spacing=0.04, vertical_spacing=0.12)
        assert grid.to_plotly_json() == validated(plain, legend)
    first = scaffold.base_figure("x", theme)
    first.layout.template.layout.font.size = 99
    assert scaffold.base_figure("x", theme).layout.template.layout.font.size != 99
