"""A training run's typed records (engine.train.records): the stored JSON does not change, old stores open.

* ``from_dict(to_dict(r)) == r`` for generated records (hypothesis), also through JSON text;
* ``to_dict(from_dict(d)) == d`` — as JSON text, key order included — for every dict real short runs store
  (digits, tiny: IDP-SGD SAMPLE and SCALE, INO-SGD with k = 2 seeds, DP-SGD-S, non-private, a secure-RNG
  run, per-sample tiers; adult for the fairness metrics), and the typed records the loop returns are the
  ones read back from the store;
* a store written by the original layout (commit 08cf57a, ``tests/fixtures/store-08cf57a.db``) opens with
  today's RunStore, every plan / evaluation / summary reads through ``from_dict`` and round-trips, and its
  records have the keys today's loop writes;
* the per-tier noise multiplier σ_k has one owner: under IDP-SGD SCALE the preview's ``noise_multipliers``,
  the audit's plan table and ``accounting.Plan.noise_multipliers`` agree per tier.

The fixture store was written once, with the original checkout on the path (``PYTHONPATH=<08cf57a checkout>``),
by this script (``python make_store.py tests/fixtures/store-08cf57a.db``)::

    import sys, torch
    from engine.config import RunConfig
    from engine.store import RunStore
    from engine.train import train
    torch.set_num_threads(1)
    store = RunStore(sys.argv[1])
    base = RunConfig().replace(**{"model.name": "lr", "data.max_train": 400, "batch_size": 64, "epochs": 2.0,
                                  "eval_every": 4})
    ino = base.replace(**{"algorithm.name": "ino", "algorithm.idp_mode": "scale", "seeds": 2}).validate()
    ids = store.create_job(ino.seed_configs(), group_id="fixture")
    train(ino, store=store, run_id=ids[0])
    dps = base.replace(**{"algorithm.name": "dpsgd_s"}).validate()
    train(dps, store=store, run_id=store.create_run(dps, group_id="fixture"))

(FIXTURE_BASE below is that base config: today's runs of it are compared with the old ones.)
"""
from __future__ import annotations

import json
import math
import shutil
import string
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.audit.pa_alooa.analysis import plan_table
from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.pa_alooa.setup import prepare_audit, preview_audit
from engine.config.run import RunConfig
from engine.jobs.kinds import execute
from engine.jobs.runs import run_record
from engine.store.db import RunStore
from engine.train.loop import prepare, preview
from engine.train.records import (ClassMetrics, EvalRecord, Fairness, GroupClipPlan, GroupClipState, InoState,
                                  MidMarkers, OverallMetrics, PlanRecord, RunSummary, TierMetrics, TierSummary,
                                  no_dp_note, tier_table)

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "store-08cf57a.db"
FIXTURE_BASE = RunConfig().replace(**{"model.name": "lr", "data.max_train": 400, "batch_size": 64, "epochs": 2.0,
                                      "eval_every": 4})
TINY = FIXTURE_BASE.replace(**{"epochs": 1.0, "eval_every": 2})


def text(d) -> str:
    """The JSON the store writes for ``d`` (key order kept; NaN as NaN)."""
    return json.dumps(d)


# ================================================================================================
# generated records: from_dict(to_dict(r)) == r
# ================================================================================================

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
maybe = st.none() | finite
names = st.text(string.ascii_letters + "ε=() ,", min_size=1, max_size=8)
counts = st.integers(min_value=0, max_value=10_000)
# unknown keys (a newer writer's): never one a type knows
extras = st.dictionaries(st.text(string.ascii_lowercase, min_size=1, max_size=6).map(lambda k: "x_" + k),
                         st.none() | st.booleans() | finite | names | st.lists(finite, max_size=3), max_size=2)


def floats_tuple(n=None, elements=finite):
    return st.lists(elements, min_size=n or 0, max_size=n or 4).map(tuple)


tier_metrics = st.builds(TierMetrics, name=names, epsilon=maybe, epsilon_spent=maybe, loss=maybe, recall=maybe,
                         accuracy=maybe, n=st.none() | counts, extra=extras)
class_metrics = st.builds(ClassMetrics, name=st.none() | names, loss=maybe, recall=maybe, accuracy=maybe,
                          extra=extras)
fairness = st.builds(Fairness, demographic_parity_difference=maybe, equalized_odds_difference=maybe, extra=extras)
evals = st.builds(
    EvalRecord, step=counts, epoch=maybe, elapsed=maybe,
    overall=st.builds(OverallMetrics, loss=maybe, accuracy=maybe, balanced_accuracy=maybe, extra=extras),
    tiers=st.lists(tier_metrics, max_size=3).map(tuple), classes=st.lists(class_metrics, max_size=3).map(tuple),
    tier_split=st.none() | st.sampled_from(["test", "train"]), fairness=st.none() | fairness,
    ino=st.none() | st.builds(InoState, rho_by_tier=st.none() | floats_tuple(elements=maybe),
                              downweighted_fraction=maybe),
    group_clip=st.none() | st.builds(GroupClipState, clip_norms=st.none() | floats_tuple(), noise_std=maybe),
    extra=extras)
mids = st.builds(MidMarkers, onset_step=st.none() | counts, end_step=st.none() | counts,
                 peak_step=st.none() | counts, peak_increase=maybe, extra=extras)
summaries = st.builds(
    RunSummary, algorithm=st.sampled_from(["idp_sample", "ino", "dpsgd_s", "nonprivate"]), label=names,
    steps=counts, planned_steps=counts, seconds=maybe, formal_dp=st.booleans(), formal_dp_reason=st.none() | names,
    accuracy=maybe, balanced_accuracy=maybe, loss=maybe,
    tiers=st.lists(st.builds(TierSummary, name=names, epsilon=maybe, epsilon_spent=maybe, recall=maybe,
                             accuracy=maybe, loss=maybe, recall_auc=maybe, mid=st.none() | mids, extra=extras),
                   max_size=3).map(tuple),
    class_recall=floats_tuple(elements=maybe), fairness=st.none() | fairness, seed=st.none() | counts,
    seed_index=st.none() | counts, seeds=st.none() | counts, extra=extras)


@st.composite
def plans(draw):
    """Plan records as the loop makes them: non-private (no planner fields), a planner plan, or DP-SGD-S
    (its set-up, no clips / noise std); the preview's fields or not."""
    k = draw(st.integers(min_value=1, max_value=3))
    kind = draw(st.sampled_from(["nonprivate", "planner", "dpsgd_s"]))
    fields = dict(steps=draw(counts), trained_steps=draw(st.none() | counts), expected_batch_size=draw(maybe),
                  tier_names=tuple(draw(st.lists(names, min_size=k, max_size=k))),
                  tier_sizes=tuple(draw(st.lists(counts, min_size=k, max_size=k))),
                  target_epsilons=draw(floats_tuple(k)), formal_dp=draw(st.booleans()),
                  formal_dp_reason=draw(st.none() | names), tail_length=draw(maybe),
                  reproducible=draw(st.sampled_from([None, False])), n_train=draw(st.none() | counts),
                  algorithm=draw(st.none() | names), seeds=draw(st.none() | counts), extra=draw(extras))
    if kind != "nonprivate":
        dpsgd_s = kind == "dpsgd_s"
        fields.update(mode=draw(st.sampled_from(["dpsgd", "scale", "sample"])), noise_multiplier=draw(finite),
                      sample_rates=draw(floats_tuple(k)), clip_norms=None if dpsgd_s else draw(floats_tuple(k)),
                      noise_std=None if dpsgd_s else draw(finite), epsilons=draw(st.none() | floats_tuple(k)),
                      delta=draw(finite), notes=tuple(draw(st.lists(names, max_size=2))),
                      release_noise_multipliers=draw(floats_tuple()))
        if dpsgd_s:
            fields["group_clip"] = GroupClipPlan(
                gradient_noise_multiplier=draw(finite), count_noise_std=draw(maybe),
                clip_rule=draw(st.sampled_from(["quantile", "reference"])), base_clip=draw(finite), c_min=draw(finite),
                c_max=draw(finite), clip_groups=tuple(draw(st.lists(names, max_size=3))),
                group_sizes=draw(floats_tuple()), group_size_source=draw(st.sampled_from(["declared", "released"])),
                group_size_noise_std=draw(maybe), expected_group_batch=draw(floats_tuple()))
    return PlanRecord(**fields)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.one_of(evals, summaries, plans()))
def test_generated_records_round_trip(record):
    cls = type(record)
    assert cls.from_dict(record.to_dict()) == record
    assert cls.from_dict(json.loads(text(record.to_dict()))) == record  # through the store's JSON text
    d = record.to_dict()
    assert cls.from_dict(d).to_dict() == d
    assert all(k in d and d[k] == v for k, v in record.extra.items())  # unknown keys are written back


def test_missing_keys_get_defaults_and_unknown_keys_are_kept():
    e = EvalRecord.from_dict({"step": 3, "tiers": [{"name": "a", "recall": 0.5}], "x_new": [1, 2],
                              "ino_rho_by_tier": [0.5]})
    assert e.step == 3 and e.epoch is None and e.overall == OverallMetrics() and e.classes == ()
    assert e.tiers[0].name == "a" and e.tiers[0].recall == 0.5 and e.tiers[0].loss is None and e.tiers[0].n is None
    assert e.extra == {"x_new": [1, 2]} and e.ino == InoState(rho_by_tier=(0.5,)) and e.group_clip is None
    assert e.fairness is None and "fairness" not in e.to_dict() and e.to_dict()["x_new"] == [1, 2]
    s = RunSummary.from_dict({})
    assert s.formal_dp is True and s.tiers == () and no_dp_note(s) == ""
    assert no_dp_note({"formal_dp": False}) == "  [no formal DP guarantee: see the run plan]"
    p = PlanRecord.from_dict({"steps": 5, "tier_names": ["a"], "future": 1})
    assert p.steps == 5 and not p.private and p.noise_multipliers is None and p.to_plan() is None
    assert p.extra == {"future": 1} and p.tiers[0].name == "a" and p.tiers[0].noise_multiplier is None
    with pytest.raises(ValueError, match="planner"):
        PlanRecord(noise_multiplier=1.0)  # planner fields without a mode: not a record the loop makes


# ================================================================================================
# real runs: to_dict(from_dict(d)) == d for what the loop stores
# ================================================================================================

RUNS = {
    "sample": TINY.replace(**{"algorithm.name": "idp_sample"}),
    "scale": TINY.replace(**{"algorithm.name": "idp_scale"}),
    "ino_k2": TINY.replace(**{"algorithm.name": "ino", "seeds": 2}),
    "dpsgd_s": TINY.replace(**{"algorithm.name": "dpsgd_s"}),
    "dpsgd_s_nonprivate_quantile": TINY.replace(**{"algorithm.name": "dpsgd_s", "algorithm.private_quantile": False}),
    "nonprivate": TINY.replace(**{"algorithm.name": "nonprivate"}),
    "secure_rng": TINY.replace(**{"algorithm.name": "dpsgd", "secure_rng": True}),
}


def _random_tiers():
    from engine.data import load_dataset
    from engine.dp.tiers import preset

    return TINY.replace(**{"algorithm.name": "idp_sample"}, tiers=preset("random_54_37_9", load_dataset("digits")))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread_module):
    """name → (store, [row ids], RunResult) of each tiny run, trained through execute into one store."""
    store = RunStore(tmp_path_factory.mktemp("records") / "runs.sqlite")
    out = {}
    for name, cfg in {**RUNS, "random_tiers": _random_tiers()}.items():
        cfg = cfg.validate()
        ids = store.create_job(cfg.seed_configs(), group_id="records")
        out[name] = (store, ids, execute(store, ids[0], cfg, kind="train"))
    return out


@pytest.fixture(scope="module")
def one_thread_module():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def assert_round_trips(cls, d):
    record = cls.from_dict(d)
    assert text(record.to_dict()) == text(d)  # exactly the JSON the store keeps, key order included
    return record


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS, "random_tiers"])
def test_stored_records_round_trip_and_are_the_loops(trained, name):
    store, ids, result = trained[name]
    assert len(ids) == len(result.per_seed) == (2 if name == "ino_k2" else 1)
    for rid, res in zip(ids, result.per_seed):
        run = store.get_run(rid)
        assert run["status"] == "finished"
        plan = assert_round_trips(PlanRecord, run["plan"])
        summary = assert_round_trips(RunSummary, run["summary"])
        evals = [assert_round_trips(EvalRecord, e) for e in store.eval_metrics(rid)]
        # what the loop returned is what the store keeps
        assert text(res.plan_record.to_dict()) == text(plan.to_dict()) == text(res.plan)
        assert text(res.run_summary.to_dict()) == text(summary.to_dict()) == text(res.summary)
        assert [text(e.to_dict()) for e in res.eval_records] == [text(e.to_dict()) for e in evals]
        assert plan == res.plan_record and summary == res.run_summary
        # the records mean what the run did
        assert summary.steps == evals[-1].step == plan.trained_steps and evals[0].step == 0
        assert summary.seed == res.config.seed and summary.accuracy == evals[-1].overall.accuracy
        assert [t.name for t in summary.tiers] == list(plan.tier_names) == [t.name for t in evals[-1].tiers]
        assert tier_table(run["summary"]) == tier_table(summary)


@pytest.mark.slow
def test_what_each_run_records(trained):
    ino = trained["ino_k2"][2]
    assert [r.run_summary.seed_index for r in ino.per_seed] == [0, 1]
    assert {r.run_summary.seeds for r in ino.per_seed} == {2}
    assert all(e.ino is not None and len(e.ino.rho_by_tier) == 3 for e in ino.eval_records)
    assert 0 < ino.eval_records[-1].ino.downweighted_fraction < 1 and ino.plan_record.tail_length > 0
    assert "seed_index" not in trained["sample"][2].summary and trained["sample"][2].run_summary.seeds is None

    dps = trained["dpsgd_s"][2]
    p = dps.plan_record
    assert p.private and p.group_clip is not None and p.clip_norms is None and p.noise_std is None
    assert p.noise_multipliers == (p.group_clip.gradient_noise_multiplier,) * 3 and p.to_plan() is None
    assert p.info == prepare(RUNS["dpsgd_s"]).info
    assert all(e.group_clip is not None and len(e.group_clip.clip_norms) == 3 for e in dps.eval_records)
    loose = trained["dpsgd_s_nonprivate_quantile"][2]
    assert not loose.plan_record.formal_dp and loose.plan_record.epsilons is None
    assert not loose.run_summary.formal_dp and "no formal DP guarantee" in no_dp_note(loose.run_summary)
    assert all(t.epsilon_spent is None for t in loose.run_summary.tiers)

    non = trained["nonprivate"][2]
    assert not non.plan_record.private and non.plan_record.noise_multipliers is None
    assert "mode" not in non.plan and all(t.sample_rate is None for t in non.plan_record.tiers)
    assert trained["secure_rng"][2].plan_record.reproducible is False and trained["secure_rng"][2].plan["reproducible"] is False
    assert "reproducible" not in trained["sample"][2].plan and trained["sample"][2].plan_record.reproducible is None
    assert trained["random_tiers"][2].eval_records[-1].tier_split == "train"
    assert trained["sample"][2].eval_records[-1].tier_split == "test"

    for name in ("sample", "scale", "ino_k2", "secure_rng"):  # the planner's plan, kept exactly
        res = trained[name][2]
        assert res.plan_record.to_plan() == prepare(res.config.job_config()).plan, name


@pytest.mark.slow
def test_preview_is_the_plan_record_with_the_preview_fields(trained):
    for name in ("sample", "ino_k2", "dpsgd_s", "nonprivate"):
        res = trained[name][2]
        p = preview(RUNS[name])
        assert isinstance(p, PlanRecord)
        assert (p.n_train, p.algorithm, p.seeds) == (400, RUNS[name].algorithm.name, RUNS[name].seeds)
        stored = p.to_dict()
        for k in ("n_train", "algorithm", "seeds"):  # the preview's own fields, written only when set
            del stored[k]
        assert text(stored) == text(res.plan)  # the preview's plan is the plan the run stores
        assert p.private == (name != "nonprivate")


@pytest.mark.slow
def test_tabular_run_records_fairness(shared_data, tmp_path, one_thread):
    from engine.data import load_dataset
    from engine.dp.tiers import preset

    cfg = RunConfig().replace(**{"data.name": "adult", "data.max_train": 800, "model.name": "lr", "epochs": 0.5,
                                 "batch_size": 128, "algorithm.name": "idp_sample", "eval_every": 2},
                              tiers=preset("two_tier_attribute", load_dataset("adult"))).validate()
    store = RunStore(tmp_path / "runs.sqlite")
    rid = store.create_run(cfg)
    result = execute(store, rid, cfg, kind="train")
    evals = [assert_round_trips(EvalRecord, e) for e in store.eval_metrics(rid)]
    summary = assert_round_trips(RunSummary, store.get_run(rid)["summary"])
    assert all(e.fairness is not None for e in evals)
    f = summary.fairness
    assert f == evals[-1].fairness == result.run_summary.fairness
    assert 0 <= f.demographic_parity_difference <= 1 and 0 <= f.equalized_odds_difference <= 1


# ================================================================================================
# a store written by the original layout (08cf57a)
# ================================================================================================

def key_shape(x):
    """The keys of a stored record, recursively (a list by its first element): what the format fixes."""
    if isinstance(x, dict):
        return {k: key_shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [key_shape(x[0])] if x and isinstance(x[0], (dict, list)) else []
    return None


@pytest.fixture
def old_store(tmp_path):
    """The fixture store, copied (opening a store may write beside it: the reserve, the journal)."""
    path = tmp_path / "store-08cf57a.db"
    shutil.copy(FIXTURE, path)
    return RunStore(path)


def test_old_store_opens_and_every_record_round_trips(old_store):
    runs = old_store.list_runs()
    assert sorted(r["id"] for r in runs) == [1, 2, 3] and {r["status"] for r in runs} == {"finished"}
    by_algo = {}
    for run in runs:
        plan = assert_round_trips(PlanRecord, run["plan"])
        summary = assert_round_trips(RunSummary, run["summary"])
        stored = old_store.eval_metrics(run["id"])
        evals = [assert_round_trips(EvalRecord, e) for e in stored]
        assert len(evals) == 4 and [e.step for e in evals] == [0, 4, 8, 12] == [e["step"] for e in stored]
        assert summary.steps == plan.steps == 12 and summary.tiers[0].mid is not None
        assert "ε target" in tier_table(run["summary"])  # python -m engine show
        by_algo.setdefault(run["algorithm"], []).append((plan, evals, summary))
    (ino0, _, s0), (ino1, evals1, s1) = by_algo["ino"]
    assert ino0 == ino1 and {s0.seed_index, s1.seed_index} == {0, 1} and s0.seeds == s1.seeds == 2
    assert ino0.mode == "scale" and evals1[-1].ino is not None and len(evals1[-1].ino.rho_by_tier) == 3
    # SCALE: a σ per tier, the strictest the shared σ*, looser tiers less (their clips are larger)
    sigma = ino0.noise_multipliers
    assert sigma == ino0.to_plan().noise_multipliers and sigma[0] == ino0.noise_multiplier
    assert sigma[0] > sigma[1] > sigma[2] and ino0.clip_norms[0] < ino0.clip_norms[2]
    [(dps, dps_evals, _)] = by_algo["dpsgd_s"]
    assert dps.group_clip.clip_groups == tuple(dps.tier_names) and dps.group_clip.group_size_source == "released"
    assert all(len(e.group_clip.clip_norms) == 3 for e in dps_evals)


@pytest.mark.slow
def test_old_store_records_have_the_keys_today_writes(old_store, tmp_path, one_thread):
    """The stored format did not change: today's run of the fixture's configs writes the same keys."""
    store = RunStore(tmp_path / "today.sqlite")
    old = {r["id"]: r for r in old_store.list_runs()}
    ino = FIXTURE_BASE.replace(**{"algorithm.name": "ino", "algorithm.idp_mode": "scale", "seeds": 2}).validate()
    ids = store.create_job(ino.seed_configs())
    execute(store, ids[0], ino, kind="train")
    dps = FIXTURE_BASE.replace(**{"algorithm.name": "dpsgd_s"}).validate()
    ids.append(store.create_run(dps))
    execute(store, ids[-1], dps, kind="train")
    for rid in ids:  # same ids as the fixture's (a fresh store)
        new = store.get_run(rid)
        added = {"dpsgd_noise_multiplier": None} if new["algorithm"] == "dpsgd_s" else {}  # σ of DP-SGD (issue 18)
        added["accountant"] = None  # whose ε the plan's are (issue 40; absent from older plans: RDP)
        assert key_shape(new["plan"]) == {**key_shape(old[rid]["plan"]), **added}
        # individual ε per group (issue 62): a key of its own in the summary and each evaluation, the rest unchanged
        summary, evals = dict(new["summary"]), [dict(e) for e in store.eval_metrics(rid)]
        assert all(d.pop("individual_epsilon")["class"]["groups"] for d in [summary, *evals])
        assert key_shape(summary) == key_shape(old[rid]["summary"])
        assert [key_shape(e) for e in evals] == [key_shape(e) for e in old_store.eval_metrics(rid)]
        assert new["plan"]["tier_names"] == old[rid]["plan"]["tier_names"]


def test_old_store_runs_feed_the_figures(old_store):
    from engine.figures import frames

    records = [run_record(old_store, r["id"]) for r in old_store.list_runs()]
    hist = frames.tier_history(records)
    assert len(hist) == 3 * 4 * 3  # runs × evaluations × tiers
    auc = frames.recall_auc_table(records).set_index(["run_id", "tier"])["recall_auc"]
    for r in records:  # the figures' recall AUC is the summary's (one owner: engine.models.metrics.recall_auc)
        for t in r["summary"]["tiers"]:
            assert auc[(r["id"], t["name"])] == pytest.approx(t["recall_auc"], rel=1e-12)


# ================================================================================================
# σ_k: one owner
# ================================================================================================

SCALE = TINY.replace(**{"algorithm.name": "idp_scale"})


@pytest.mark.slow
def test_scale_noise_multipliers_agree_between_preview_audit_and_plan():
    prep = prepare(SCALE)
    planned = prep.plan.noise_multipliers
    record = preview(SCALE)
    assert record.noise_multipliers == planned
    assert [t.noise_multiplier for t in record.tiers] == list(planned)
    # the Train page's plan table shows the record's σ_k (rounded for display)
    from app_pages._plans import plan_frame

    assert list(plan_frame(record)["σ (noise mult.)"]) == [round(s, 4) for s in planned]
    # the audit's plan table for this very plan (plan_table directly)
    table = plan_table(SimpleNamespace(tiers=prep.tiers, steps=prep.steps),
                       SimpleNamespace(plan=prep.plan, privacy=prep.privacy, formal_dp=True))
    assert [row["noise_multiplier"] for row in table] == list(planned)
    # SCALE really differs per tier: σ*·C/C_k, not the shared σ* the audit table used to show
    assert planned[0] == prep.plan.noise_multiplier and planned[0] > planned[1] > planned[2]
    for k, sigma in enumerate(planned):
        assert sigma == pytest.approx(prep.plan.noise_std / prep.plan.clip_norms[k], rel=1e-12)

    # an audit of the same config (its models plan for half-size tiers): its own plan's σ_k per tier
    audit = AuditConfig(run=SCALE, algorithms=(SCALE.algorithm,), R=2, group_by="tier", n_boot=20, null_perms=2)
    shown = preview_audit(audit)["algorithms"][0]["plan"]
    [algo] = prepare_audit(audit).algos
    assert [row["noise_multiplier"] for row in shown] == list(algo.plan.noise_multipliers)
    assert len(set(row["noise_multiplier"] for row in shown)) == 3 and all(math.isfinite(r["noise_multiplier"]) for r in shown)
