"""Regression fixture for ``engine.audit.pa_alooa.stats``: today's numbers, frozen.

``tests/fixtures/audit_stats_regression.npz`` holds the inputs of three small audits and every output
the statistics give for them, as computed by the statistics before they were vectorised (issue 17);
the dict outputs are in the ``.json`` beside it. The tests recompute them with the current code and
require equality to 1e-12 (absolute and relative; NaN where NaN; integers exact). Δ of ``bootstrap_gpr`` is
bias-corrected since issue 58: its entries in the ``.json`` (``delta`` of ``boot_*``) were rewritten from the
reference below then, everything else (the GPRs and their CIs included) kept as it was.

* ``A``: PA-ALOOA pairs (2R = 40, n = 2000), three groups of unequal size with different signal,
  three tiers; a few columns with ties, all-equal scores, adjacent float64 scores (the threshold
  midpoint not representable) and ±inf scores.
* ``B``: A's design with scores rounded to halves (ties everywhere, like a float32 loss).
* ``C``: no pair structure (30 models, n = 600, random membership): columns where every model or no
  model holds the sample (NaN advantages; a group of nothing but those), columns with one member.

Besides the fixture, the engine is compared with the pre-vectorisation code kept below (the
reference: for these comparisons, the fixture and the timing only) on random audits, paired and not,
with and without ties, piece by piece (thresholds, ROCs) and on small and degenerate inputs.

    python tests/test_audit_stats_regression.py --time [--real PATH.npz]   # old vs new side by side, same outputs
    python tests/test_audit_stats_regression.py --write                    # rewrite the fixture from the reference
"""
from __future__ import annotations

import itertools
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Hashable

import numpy as np
import pytest
from scipy import stats as _sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.audit.pa_alooa import stats as new  # noqa: E402
from engine.audit.pa_alooa.stats import thresholds  # noqa: E402  (the threshold machinery's own names)
from engine.audit.pa_alooa.design import complementary_membership  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "audit_stats_regression.npz"
FIXTURE_JSON = FIXTURE.with_suffix(".json")
TOL = 1e-12
CASES = ("A", "B", "C")


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------
def build_inputs() -> dict[str, np.ndarray]:
    """The fixture's stored inputs (deterministic; only used to write the fixture)."""
    rng = np.random.default_rng(2026)
    out = {}
    # A: the PA-ALOOA pair design
    n, R = 2000, 20
    m = complementary_membership(n, R, seed=5)
    groups = rng.choice(np.array(["F", "M", "X"]), size=n, p=[0.55, 0.4, 0.05])
    effect = {"F": 0.3, "M": 0.7, "X": 1.2}
    eff = np.array([effect[g] for g in groups]) * rng.gamma(2.0, 0.5, size=n)
    s = rng.standard_normal(m.shape) * rng.uniform(0.5, 2.0, size=n)[None, :] + eff[None, :] * m
    s[:, 10:40] = np.round(s[:, 10:40], 1)  # ties
    s[:, 40:45] = 0.25  # one tie: nothing separates
    for j in range(45, 50):  # adjacent float64 scores: midpoints between neighbours are not representable
        rank = np.argsort(np.argsort(s[:, j]))
        s[:, j] = 1.5 + rank * np.spacing(1.5)
    s[0, 50:54], s[3, 50:54], s[6, 52:56] = np.inf, -np.inf, np.inf  # infinite scores
    s[1, 55], s[2, 55] = -np.inf, -np.inf
    out["A_scores"], out["A_membership"] = s, m
    out["A_groups"], out["A_tiers"] = groups, rng.integers(0, 3, size=n).astype(np.int8)
    # B: the same design, scores rounded to halves (float16 holds them exactly)
    out["B_scores"] = (np.round(np.clip(np.where(np.isfinite(s), s, 0.0), -7.0, 7.0) * 2) / 2).astype(np.float16)
    # C: no pair structure
    M, n = 30, 600
    mc = rng.random((M, n)) < rng.uniform(0.2, 0.8, size=n)[None, :]
    mc[:, :20], mc[:, 20:40] = True, False
    mc[:, 40:50] = False
    mc[rng.integers(0, M, size=10), np.arange(40, 50)] = True  # exactly one member
    sc = rng.standard_normal((M, n)) + 0.8 * mc
    sc[:, 100:150] = np.round(sc[:, 100:150])
    gc = rng.integers(0, 2, size=n).astype(np.int8)
    gc[:40] = 2  # a group of samples without members or without non-members only
    out["C_scores"], out["C_membership"], out["C_groups"] = sc, mc, gc
    return out


def case_inputs(stored: dict, case: str) -> dict:
    """One case's inputs (scores float64, membership bool, groups, tiers, LiRA confidences)."""
    if case == "A":
        s = np.asarray(stored["A_scores"], np.float64)
        return {"scores": s, "membership": stored["A_membership"], "groups": stored["A_groups"],
                "tiers": stored["A_tiers"], "conf": np.clip(s, -30.0, 30.0)}
    if case == "B":
        s = np.asarray(stored["B_scores"], np.float64)
        return {"scores": s, "membership": stored["A_membership"], "groups": stored["A_groups"],
                "tiers": stored["A_tiers"], "conf": s}
    s = np.asarray(stored["C_scores"], np.float64)
    return {"scores": s, "membership": stored["C_membership"], "groups": stored["C_groups"],
            "tiers": stored["C_groups"], "conf": s}


def random_inputs(seed: int, paired: bool, ties: bool) -> dict:
    """A random small audit for the comparison with the reference."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 400))
    if paired:
        m = complementary_membership(n, int(rng.integers(2, 12)), seed=seed)
    else:
        M = int(rng.integers(4, 25))
        m = rng.random((M, n)) < rng.uniform(0.0, 1.0, size=n)[None, :]
    s = rng.standard_normal(m.shape) + rng.uniform(0, 2, size=n)[None, :] * m
    if ties:
        s = np.round(s * rng.integers(1, 4))
    g = rng.integers(0, int(rng.integers(1, 4)), size=n)
    return {"scores": s, "membership": m, "groups": g, "tiers": rng.integers(0, 2, size=n), "conf": s}


# --------------------------------------------------------------------------------------------
# outputs
# --------------------------------------------------------------------------------------------
def _roc_counts(fpr, tpr, P, N) -> dict[str, np.ndarray]:
    """An ROC as its integer counts' increments (compact; ``tpr = cumsum / P`` gives it back exactly)."""
    tp, fp = np.rint(np.asarray(tpr) * P).astype(np.int64), np.rint(np.asarray(fpr) * N).astype(np.int64)
    assert np.array_equal(tp / P, tpr) and np.array_equal(fp / N, fpr)
    return {"tp": np.diff(tp).astype(np.int32), "fp": np.diff(fp).astype(np.int32), "PN": np.array([P, N])}


def compute(S, x: dict, *, full: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every statistic of one case with the implementation ``S`` (the engine's module or the reference):
    (arrays, dicts). The arguments cover what ``engine.audit.pa_alooa.analysis.algorithm_report`` passes and more."""
    s, m, g, tiers, conf = x["scores"], x["membership"], x["groups"], x["tiers"], x["conf"]
    arr, dic = {}, {}
    arr["adv_in"] = S.sample_advantage(s, m, threshold="in_sample")
    arr["adv_ho0"] = ho = S.sample_advantage(s, m, threshold="held_out", seed=0)
    arr["adv_ho7"] = S.sample_advantage(s, m, threshold="held_out", seed=7)
    dic["boot_ho"] = S.bootstrap_gpr(ho, g, n_boot=300, ci=0.9, seed=3)
    dic["boot_in"] = S.bootstrap_gpr(arr["adv_in"], g, n_boot=200, seed=0)
    if full:
        dic["boot_big"] = S.bootstrap_gpr(ho, g, n_boot=2000, ci=0.95, seed=11)  # index draws in several chunks
    dic["null_ho"] = S.null_distribution(s, m, g, threshold="held_out", n_perm=4, seed=1)
    dic["null_in"] = S.null_distribution(s, m, g, threshold="in_sample", n_perm=3, ci=0.8, seed=2)
    dic["floor"] = {"ho": S.null_floor(s, m, threshold="held_out", n_perm=2, seed=5),
                    "in": S.null_floor(s, m, threshold="in_sample", n_perm=2, seed=6)}
    dic["pa"] = {"ga": S.pa_ga(s, m), "gba": S.pa_gba(s, m, g)}
    with_both = (i for i in range(s.shape[1]) if m[:, i].any() and not m[:, i].all())
    dic["looa"] = [S.pa_looa(s[m[:, i], i], s[~m[:, i], i]) for i in itertools.islice(with_both, 6)]  # the first 6
    dic["eps"] = S.per_group_epsilon_lower_bound(s, m, tiers, delta=1e-5, seed=0)
    dic["eps16"] = S.per_group_epsilon_lower_bound(s, m, g, delta=1e-3, confidence=0.9, seed=3, max_thresholds=16)
    lira = S.lira_scores(conf, m)
    fin = ~np.isnan(lira)  # the ROCs need both labels among each group's finite scores
    both = {v for v in np.unique(g) if (m & fin)[:, g == v].any() and (~m & fin)[:, g == v].any()}
    keep = np.isin(g, list(both))
    dic["lira_by_group"] = S.lira_by_group(lira[:, keep], m[:, keep], g[keep])
    ok = np.isfinite(lira)
    arr["lira_nan"] = ~ok
    arr["lira_summary"] = np.array([lira[ok].sum(), (lira[ok] ** 2).sum(), lira[ok].min(), lira[ok].max()])
    arr["lira_sample"] = lira.ravel()[::53]
    for k, v in enumerate(np.unique(g)):
        sel = g == v
        if v in both:
            fpr, tpr = S.roc_curve_points(lira[:, sel], m[:, sel])
            y = m[:, sel][~np.isnan(lira[:, sel])]
            for name, a in _roc_counts(fpr, tpr, int(y.sum()), int((~y).sum())).items():
                arr[f"roc_lira{k}_{name}"] = a
        fpr, tpr = S.roc_curve_points(s[:, sel], m[:, sel])
        for name, a in _roc_counts(fpr, tpr, int(m[:, sel].sum()), int((~m[:, sel]).sum())).items():
            arr[f"roc_score{k}_{name}"] = a
    return arr, dic


def _norm(o):
    """JSON-shaped: keys as strings, numpy scalars as Python's."""
    if isinstance(o, dict):
        return {str(k): _norm(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_norm(v) for v in o]
    if isinstance(o, np.generic):
        return o.item()
    return o


def assert_same(got, exp, where: str = "") -> None:
    """Equal to TOL (absolute and relative), NaN where NaN, integers and infinities exact."""
    if isinstance(exp, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(exp), f"{where}: keys {sorted(got)} != {sorted(exp)}"
        for k in exp:
            assert_same(got[k], exp[k], f"{where}.{k}")
    elif isinstance(exp, list):
        assert isinstance(got, list) and len(got) == len(exp), f"{where}: length"
        for i, (a, b) in enumerate(zip(got, exp)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(exp, bool) or exp is None or isinstance(exp, str):
        assert got == exp, f"{where}: {got!r} != {exp!r}"
    elif isinstance(exp, int):
        assert isinstance(got, int) and got == exp, f"{where}: {got!r} != {exp!r}"
    elif isinstance(exp, float):
        assert isinstance(got, (float, int)), f"{where}: {got!r} is not a number"
        if math.isnan(exp) or math.isinf(exp):
            assert (math.isnan(got) and math.isnan(exp)) or got == exp, f"{where}: {got!r} != {exp!r}"
        else:
            assert abs(got - exp) <= TOL + TOL * abs(exp), f"{where}: {got!r} != {exp!r} (diff {got - exp:.3g})"
    else:
        e, a = np.asarray(exp), np.asarray(got)
        assert a.shape == e.shape, f"{where}: shape {a.shape} != {e.shape}"
        if e.dtype.kind in "biu":
            assert np.array_equal(a, e), f"{where}: integers differ"
        else:
            np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg=f"{where}: NaN positions")
            np.testing.assert_allclose(a, e, rtol=TOL, atol=TOL, err_msg=where)


def write_fixture(path: Path = FIXTURE) -> None:
    """The fixture, computed by the reference (the statistics before vectorisation)."""
    stored = build_inputs()
    arrays, dicts = dict(stored), {}
    for case in CASES:
        arr, dic = compute(OLD, case_inputs(stored, case))
        arrays.update({f"{case}_out_{k}": v for k, v in arr.items()})
        dicts[case] = _norm(dic)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    path.with_suffix(".json").write_text(json.dumps(dicts, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB) and {path.with_suffix('.json').name}")


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE, allow_pickle=False) as f:
        stored = {k: f[k] for k in f.files}
    return stored, json.loads(FIXTURE_JSON.read_text())


@pytest.fixture(scope="module")
def recomputed(fixture):
    stored, _ = fixture
    return {case: compute(new, case_inputs(stored, case)) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_arrays_equal_the_fixture(fixture, recomputed, case):
    stored, _ = fixture
    arr, _ = recomputed[case]
    names = sorted(k[len(case) + 5:] for k in stored if k.startswith(f"{case}_out_"))
    assert names == sorted(arr)
    for k in names:
        assert_same(arr[k], stored[f"{case}_out_{k}"], f"{case}.{k}")


@pytest.mark.parametrize("case", CASES)
def test_dicts_equal_the_fixture(fixture, recomputed, case):
    _, dicts = fixture
    _, dic = recomputed[case]
    assert_same(_norm(dic), dicts[case], case)


def test_fixture_covers_the_edge_cases(fixture):
    stored, dicts = fixture
    assert np.isnan(stored["C_out_adv_ho0"]).sum() >= 40 and not np.isnan(stored["A_out_adv_ho0"]).any()
    assert math.isnan(dicts["C"]["boot_ho"]["groups"]["2"]["mean"])  # a group with no finite advantage
    assert (stored["A_out_adv_ho0"] < 0).any() and np.isinf(stored["A_scores"]).any()
    assert FIXTURE.stat().st_size + FIXTURE_JSON.stat().st_size < 2_000_000


@pytest.mark.parametrize("seed", range(12))
def test_matches_the_reference_on_random_audits(seed):
    x = random_inputs(seed, paired=seed % 3 != 2, ties=seed % 2 == 1)
    got_a, got_d = compute(new, x, full=False)
    exp_a, exp_d = compute(OLD, x, full=False)
    for k in exp_a:
        assert_same(got_a[k], exp_a[k], k)
    assert_same(_norm(got_d), _norm(exp_d))


@pytest.mark.parametrize("seed", range(8))
def test_thresholds_and_rocs_match_the_reference(seed):
    """The pieces on their own: chosen thresholds (both halves), ROCs with NaN scores and ties."""
    x = random_inputs(100 + seed, paired=seed % 2 == 0, ties=seed % 4 < 2)
    s, m = x["scores"], x["membership"]
    for a, b in ((thresholds._best_threshold(s, m, want_threshold=True), _best_threshold(s, m, want_threshold=True)),
                 (thresholds._best_threshold(s.T, m.T, want_threshold=True), _best_threshold(s.T, m.T, want_threshold=True))):
        assert_same(a[0], b[0], "advantage")
        assert_same(a[1], b[1], "threshold")
    lira = np.where(np.random.default_rng(seed).random(s.shape) < 0.1, np.nan, s)
    if (m & ~np.isnan(lira)).any() and (~m & ~np.isnan(lira)).any():
        for a, b in zip(new.roc_curve_points(lira, m), roc_curve_points(lira, m)):
            assert_same(a, b, "roc")


@pytest.mark.parametrize("R", [251, 257])
def test_held_out_at_the_limits_of_its_packing_matches_the_reference(R):
    """The held-out search packs each half's counts in int16 up to ~500 models (2R = 502: halves of 250 and 252
    models, sums up to 32,512 of int16's 32,767) and in int32 beyond (2R = 514): columns where the members' scores
    all lie above (the largest sums), or all below (the smallest), the non-members', and columns with ties."""
    n = 24
    m = complementary_membership(n, R, seed=R)
    rng = np.random.default_rng(R)
    s = rng.standard_normal(m.shape) + 0.5 * m
    s[:, :6] = np.where(m[:, :6], 10.0, -10.0) + rng.standard_normal((2 * R, 6))  # members all above
    s[:, 6:12] = np.where(m[:, 6:12], -10.0, 10.0) + rng.standard_normal((2 * R, 6))  # members all below
    s[:, 12:18] = np.round(s[:, 12:18])  # ties
    sizes = (2 * (R // 2), 2 * (R - R // 2))
    assert thresholds._halves_packing(sizes)[1] == (np.int16 if R == 251 else np.int32)
    for seed in range(3):
        assert_same(new.sample_advantage(s, m, threshold="held_out", seed=seed),
                    sample_advantage(s, m, threshold="held_out", seed=seed), "held-out advantage")
    assert np.nanmax(new.sample_advantage(s, m, threshold="held_out")[:6]) == 1.0
    g = np.arange(n) % 3
    assert_same(_norm(new.null_distribution(s, m, g, threshold="held_out", n_perm=2, seed=4)),
                _norm(null_distribution(s, m, g, threshold="held_out", n_perm=2, seed=4)))


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")
def test_small_and_degenerate_inputs_match_the_reference():
    rng = np.random.default_rng(1)
    for M, n in ((2, 5), (4, 1), (6, 3), (3, 7)):
        m = rng.random((M, n)) < 0.5
        s = rng.integers(0, 3, size=(M, n)).astype(float)
        assert_same(new.sample_advantage(s, m), sample_advantage(s, m))
        assert_same(new.pa_ga(s, m), pa_ga(s, m))
        for f in (lambda S: S.sample_advantage(s, m, threshold="held_out"),
                  lambda S: S.null_distribution(s, m, np.zeros(n), threshold="held_out", n_perm=2)):
            try:
                exp = f(OLD)
            except ValueError as e:
                with pytest.raises(ValueError, match=str(e)[:20]):
                    f(new)
            else:
                assert_same(_norm(f(new)), _norm(exp))
    paired = complementary_membership(3, 1, seed=0)  # one pair: no held-out split
    with pytest.raises(ValueError, match="2 complementary pairs"):
        new.sample_advantage(np.zeros(paired.shape), paired, threshold="held_out")
    with pytest.raises(ValueError, match="threshold"):
        new.null_distribution(np.zeros(paired.shape), paired, np.zeros(3), threshold="nope")


# --------------------------------------------------------------------------------------------
# side-by-side timing (not a test): python tests/test_audit_stats_regression.py --time
# --------------------------------------------------------------------------------------------
def _report_calls(S, d: dict) -> tuple[dict[str, float], dict[str, Any]]:
    """The statistics ``algorithm_report`` runs (held-out, 20 permutations, 1000 bootstrap draws), timed in CPU
    seconds of this process (steadier than wall time on a shared machine); -> (seconds, results)."""
    s, m, g, tiers, conf, seed = d["scores"], d["membership"], d["groups"], d["tiers"], d["conf"], 0
    out, res = {}, {}

    def t(name, f):
        t0 = time.process_time()
        res[name] = f()
        out[name] = time.process_time() - t0
        return res[name]

    adv = t("sample_advantage", lambda: S.sample_advantage(s, m, threshold="held_out", seed=seed))
    t("bootstrap_gpr", lambda: S.bootstrap_gpr(adv, g, n_boot=1000, ci=0.95, seed=seed))
    t("null_distribution", lambda: S.null_distribution(s, m, g, threshold="held_out", n_perm=20, ci=0.95,
                                                       seed=seed + 1))
    t("pa_ga", lambda: S.pa_ga(s, m))
    t("pa_gba", lambda: S.pa_gba(s, m, g))
    lira = t("lira_scores", lambda: S.lira_scores(conf, m))
    t("roc_curve_points", lambda: [S.roc_curve_points(lira[:, g == v], m[:, g == v]) for v in np.unique(g)])
    t("per_group_epsilon_lower_bound", lambda: S.per_group_epsilon_lower_bound(s, m, tiers, delta=1e-5, seed=seed))
    out["total"] = sum(out.values())
    return out, res


def time_side_by_side(real: str | None = None) -> None:
    """Old and new on the same audit, one after the other in this process; then checks they agree."""
    if real:  # scores dumped from an audit: confs, membership, groups, tiers
        f = np.load(real)
        d = {"scores": np.asarray(f["confs"], np.float64), "membership": f["membership"], "groups": f["groups"],
             "tiers": f["tiers"], "conf": np.asarray(f["confs"], np.float64)}
    else:  # Adult-sized: 2R = 400, n = 30 162, two groups
        rng = np.random.default_rng(0)
        m = complementary_membership(30162, 200, seed=0)
        g = np.where(rng.random(30162) < 0.32, "Female", "Male")
        s = rng.standard_normal(m.shape) + 0.2 * m
        d = {"scores": s, "membership": m, "groups": g, "tiers": np.zeros(30162, np.int64), "conf": s}
    new_t, new_r = _report_calls(new, d)
    old_t, old_r = _report_calls(OLD, d)
    print(f"{'statistic (CPU seconds)':32s} {'old s':>8s} {'new s':>8s} {'ratio':>7s}")
    for k in old_t:
        print(f"{k:32s} {old_t[k]:8.2f} {new_t[k]:8.2f} {old_t[k] / max(new_t[k], 1e-9):7.1f}x")
    for k in old_r:
        a, b = new_r[k], old_r[k]
        if k == "roc_curve_points":
            for (f1, t1), (f2, t2) in zip(a, b):
                assert_same(f1, f2, k)
                assert_same(t1, t2, k)
        else:
            assert_same(_norm(a) if isinstance(a, dict) else a, _norm(b) if isinstance(b, dict) else b, k)
    print("outputs equal (to 1e-12)")


# --------------------------------------------------------------------------------------------
# the reference: engine/audit/pa_alooa/stats.py before vectorisation (issue 17), verbatim less docstrings; Δ in
# bootstrap_gpr bias-corrected since (issue 58)
# --------------------------------------------------------------------------------------------
_CHUNK_ELEMS = 2_000_000


def _as_pair(scores, membership) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    m = np.asarray(membership)
    if s.ndim != 2:
        raise ValueError(f"scores must be 2-D (n_models, n_samples), got shape {s.shape}")
    if m.shape != s.shape:
        raise ValueError(f"membership shape {m.shape} != scores shape {s.shape}")
    if m.dtype != np.bool_:
        if not np.isin(m, (0, 1)).all():
            raise ValueError("membership must be boolean (or 0/1)")
        m = m.astype(bool)
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    return s, m


def _py(v: Any) -> Hashable:
    return v.item() if isinstance(v, np.generic) else v


def _group_index(groups, n: int) -> tuple[list, list[np.ndarray]]:
    g = np.asarray(groups)
    if g.shape != (n,):
        raise ValueError(f"groups must have shape ({n},), got {g.shape}")
    values, inverse = np.unique(g, return_inverse=True)
    idx = [np.flatnonzero(inverse == k) for k in range(len(values))]
    return [_py(v) for v in values], idx


def _is_paired(membership: np.ndarray) -> bool:
    M = membership.shape[0]
    return M >= 2 and M % 2 == 0 and bool(np.all(membership[0::2] != membership[1::2]))


def _split_models(membership: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    M = membership.shape[0]
    if _is_paired(membership):
        R = M // 2
        if R < 2:
            raise ValueError("need at least 2 complementary pairs (2R >= 4) to split models")
        perm = rng.permutation(R)
        a, b = np.sort(perm[: R // 2]), np.sort(perm[R // 2:])
        pa = np.stack([2 * a, 2 * a + 1], axis=1).ravel()
        pb = np.stack([2 * b, 2 * b + 1], axis=1).ravel()
        return pa, pb
    if M < 4:
        raise ValueError("need at least 4 models to split them in halves")
    perm = rng.permutation(M)
    return np.sort(perm[: M // 2]), np.sort(perm[M // 2:])


def _best_threshold_chunk(s: np.ndarray, m: np.ndarray, want_threshold: bool):
    k, M = s.shape
    order = np.argsort(-s, axis=1, kind="stable")
    ss = np.take_along_axis(s, order, axis=1)
    mm = np.take_along_axis(m, order, axis=1)
    P = mm.sum(axis=1)
    N = M - P
    P = P.astype(np.int64)
    N = N.astype(np.int64)
    tp = np.cumsum(mm, axis=1, dtype=np.int64)
    # position j (0-based, "include the top j+1 scores") -> fp = j+1-tp
    fp = np.arange(1, M + 1, dtype=np.int64)[None, :] - tp
    # exact integer objective: (TPR - FPR) * P * N = tp*N - fp*P  (so equally
    # good rules tie exactly and the tie-break below is deterministic)
    val = tp * N[:, None]
    val -= fp * P[:, None]
    valid = np.empty((k, M), dtype=bool)
    valid[:, :-1] = ss[:, :-1] != ss[:, 1:]
    valid[:, -1] = True
    val[~valid] = np.iinfo(np.int64).min
    j = np.argmax(val, axis=1)
    best = val[np.arange(k), j]
    empty = best <= 0  # the empty rule (t=+inf) gives 0 and wins ties
    bad = (P == 0) | (N == 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        adv = np.where(empty, 0.0, best / (P * N).astype(np.float64))
    adv[bad] = np.nan
    if not want_threshold:
        return adv, None
    rows = np.arange(k)
    hi = ss[rows, j]
    lo = np.where(j + 1 < M, ss[rows, np.minimum(j + 1, M - 1)], -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = 0.5 * hi + 0.5 * lo
    t = np.where(np.isfinite(lo) & (mid > lo) & (mid <= hi), mid, hi)
    t = np.where(j + 1 >= M, -np.inf, t)  # all included
    t = np.where(empty, np.nan, t)  # empty rule: "score >= nan" is never true
    return adv, t


def _best_threshold(scores: np.ndarray, membership: np.ndarray, want_threshold: bool = False):
    M, n = scores.shape
    adv = np.empty(n)
    thr = np.empty(n) if want_threshold else None
    step = max(1, _CHUNK_ELEMS // max(M, 1))
    for a in range(0, n, step):
        b = min(n, a + step)
        s = np.ascontiguousarray(scores[:, a:b].T)
        m = np.ascontiguousarray(membership[:, a:b].T)
        r, t = _best_threshold_chunk(s, m, want_threshold)
        adv[a:b] = r
        if want_threshold:
            thr[a:b] = t
    return (adv, thr) if want_threshold else adv


def _eval_threshold(scores: np.ndarray, membership: np.ndarray, t: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        pred = scores >= t[None, :]
    P = membership.sum(axis=0)
    N = membership.shape[0] - P
    tp = (pred & membership).sum(axis=0)
    fp = (pred & ~membership).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = tp / P - fp / N
    out[(P == 0) | (N == 0)] = np.nan
    return out


def sample_advantage(scores, membership, *, threshold: str = "in_sample", seed=0) -> np.ndarray:
    s, m = _as_pair(scores, membership)
    if threshold == "in_sample":
        return _best_threshold(s, m)
    if threshold != "held_out":
        raise ValueError(f"threshold must be 'in_sample' or 'held_out', got {threshold!r}")
    rng = np.random.default_rng(seed)
    ia, ib = _split_models(m, rng)
    sa, ma, sb, mb = s[ia], m[ia], s[ib], m[ib]
    _, ta = _best_threshold(sa, ma, want_threshold=True)
    _, tb = _best_threshold(sb, mb, want_threshold=True)
    ab = _eval_threshold(sb, mb, ta)
    ba = _eval_threshold(sa, ma, tb)
    return 0.5 * (ab + ba)


def gpr_delta(gpr: dict) -> float:
    vals = [v for v in gpr.values() if not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return float("nan")
    return float((max(vals) - min(vals)) * 100.0)


def bootstrap_gpr(advantage, groups, *, n_boot: int = 1000, ci: float = 0.95, seed=0) -> dict:
    if not 0 < ci < 1:
        raise ValueError("ci must be in (0, 1)")
    adv = np.asarray(advantage, dtype=np.float64)
    values, idx = _group_index(groups, adv.shape[0])
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 100 * (1 - ci) / 2, 100 * (1 + ci) / 2
    boots = np.empty((len(values), n_boot))
    res_groups = {}
    for gi, (v, ix) in enumerate(zip(values, idx)):
        a = adv[ix]
        a = a[~np.isnan(a)]
        k = a.size
        if k == 0:
            boots[gi] = np.nan
            res_groups[v] = {"mean": float("nan"), "low": float("nan"), "high": float("nan")}
            continue
        step = max(1, _CHUNK_ELEMS // k)
        for s0 in range(0, n_boot, step):
            s1 = min(n_boot, s0 + step)
            draw = rng.integers(0, k, size=(s1 - s0, k))
            boots[gi, s0:s1] = a[draw].mean(axis=1)
        res_groups[v] = {
            "mean": float(a.mean()),
            "low": float(np.percentile(boots[gi], lo_q)),
            "high": float(np.percentile(boots[gi], hi_q)),
        }
    point = gpr_delta({v: r["mean"] for v, r in res_groups.items()})
    with np.errstate(invalid="ignore"):
        dboot = (np.nanmax(boots, axis=0) - np.nanmin(boots, axis=0)) * 100.0 if len(values) else np.array([np.nan])
    # Δ bias-corrected (issue 58; the fixture's Δ was rewritten then, its GPRs kept): 2 Δ̂ − median Δ*, clipped at
    # 0, ± the wider of Δ*'s two tails about its median
    if math.isnan(point):
        delta = {"value": point, "low": point, "high": point}
    else:
        lo, med, hi = sorted(float(q) for q in np.percentile(dboot, [lo_q, 50.0, hi_q]))
        value, half = 2 * point - med, max(hi - med, med - lo)
        delta = {"value": max(0.0, value), "low": max(0.0, value - half), "high": max(0.0, value + half)}
    return {
        "groups": res_groups,
        "delta": {**delta, "plug_in": point},
        "n_boot": int(n_boot),
        "ci": float(ci),
    }


def _permute_membership(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    M, n = m.shape
    if _is_paired(m):
        # Re-draw which model of each complementary pair holds the sample: the
        # same randomisation as the design, keeps exactly R members and the
        # pair structure (so held_out stays stratified).
        flip = rng.random((M // 2, n)) < 0.5
        out = np.empty_like(m)
        out[0::2] = m[0::2] ^ flip
        out[1::2] = ~out[0::2]
        return out
    order = np.argsort(rng.random((M, n)), axis=0)
    return np.take_along_axis(m, order, axis=0)


def null_floor(scores, membership, *, threshold: str = "in_sample", n_perm: int = 1, seed=0) -> float:
    s, m = _as_pair(scores, membership)
    return null_distribution(s, m, np.zeros(s.shape[1], np.int8), threshold=threshold, n_perm=n_perm,
                             seed=seed)["floor"]


def null_distribution(scores, membership, groups, *, threshold: str = "in_sample", n_perm: int = 20,
                      ci: float = 0.95, seed=0) -> dict:
    if not 0 < ci < 1:
        raise ValueError("ci must be in (0, 1)")
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    rng = np.random.default_rng(seed)
    floors, gprs, deltas = [], [], []
    for _ in range(int(n_perm)):
        mp = _permute_membership(m, rng)
        adv = sample_advantage(s, mp, threshold=threshold, seed=int(rng.integers(2**63 - 1)))
        floors.append(np.nanmean(adv))
        with np.errstate(invalid="ignore"):
            g = [np.nanmean(adv[ix]) if np.isfinite(adv[ix]).any() else np.nan for ix in idx]
        gprs.append(g)
        deltas.append(gpr_delta(dict(zip(values, g))))
    gprs_a = np.asarray(gprs, dtype=np.float64).reshape(len(floors), len(values))
    d = np.asarray(deltas, dtype=np.float64)
    d = d[np.isfinite(d)]
    lo_q, hi_q = 100 * (1 - ci) / 2, 100 * (1 + ci) / 2
    with np.errstate(invalid="ignore"):
        group_floor = {v: float(np.nanmean(gprs_a[:, k])) if np.isfinite(gprs_a[:, k]).any() else float("nan")
                       for k, v in enumerate(values)}
    return {"floor": float(np.mean(floors)), "groups": group_floor,
            "delta": {"value": float(d.mean()) if d.size else float("nan"),
                      "low": float(np.percentile(d, lo_q)) if d.size else float("nan"),
                      "high": float(np.percentile(d, hi_q)) if d.size else float("nan")},
            "n_perm": int(n_perm)}


def pa_ga(scores, membership) -> float:
    s, m = _as_pair(scores, membership)
    return float(np.nanmean(_best_threshold(s.T, m.T)))


def pa_gba(scores, membership, groups) -> dict:
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    out = {}
    for v, ix in zip(values, idx):
        adv = _best_threshold(s[:, ix].T, m[:, ix].T)
        out[v] = float(np.nanmean(adv)) if np.isfinite(adv).any() else float("nan")
    return out


def pa_looa(scores_with, scores_without) -> float:
    a = np.asarray(scores_with, dtype=np.float64).ravel()
    b = np.asarray(scores_without, dtype=np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("need at least one score with and one without the record")
    s = np.concatenate([a, b])[:, None]
    m = np.concatenate([np.ones(a.size, bool), np.zeros(b.size, bool)])[:, None]
    return float(sample_advantage(s, m)[0])


def lira_scores(conf, membership) -> np.ndarray:
    c, m = _as_pair(conf, membership)
    mf = m.astype(np.float64)
    n_in = mf.sum(axis=0)
    n_out = m.shape[0] - n_in
    s_in = (c * mf).sum(axis=0)
    s_out = c.sum(axis=0) - s_in
    with np.errstate(divide="ignore", invalid="ignore"):
        mu_in_full = s_in / n_in
        mu_out_full = s_out / n_out
        resid = np.where(m, c - mu_in_full, c - mu_out_full)
        ok = ~np.isnan(resid)
        dof = ok.sum() - np.count_nonzero(n_in > 0) - np.count_nonzero(n_out > 0)
        var = float(np.nansum(resid**2) / max(dof, 1))
        var = max(var, 1e-30)
        li_n_in = n_in[None, :] - mf
        li_n_out = n_out[None, :] - (1.0 - mf)
        mu_in = (s_in[None, :] - c * mf) / li_n_in
        mu_out = (s_out[None, :] - c * (1.0 - mf)) / li_n_out
        out = ((c - mu_out) ** 2 - (c - mu_in) ** 2) / (2.0 * var)
    out[(li_n_in <= 0) | (li_n_out <= 0)] = np.nan
    return out


def roc_curve_points(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    if s.shape != y.shape:
        raise ValueError("scores and labels must have the same size")
    keep = ~np.isnan(s)
    s, y = s[keep], y[keep]
    P, N = int(y.sum()), int((~y).sum())
    if P == 0 or N == 0:
        raise ValueError("need both positive and negative labels")
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    tp = np.cumsum(y)
    fp = np.cumsum(~y)
    last = np.r_[s[:-1] != s[1:], True]
    tpr = np.r_[0.0, tp[last] / P]
    fpr = np.r_[0.0, fp[last] / N]
    return fpr, tpr


def auc(fpr, tpr) -> float:
    f = np.asarray(fpr, dtype=np.float64)
    t = np.asarray(tpr, dtype=np.float64)
    return float(np.sum(np.diff(f) * (t[1:] + t[:-1]) * 0.5))


def tpr_at_fpr(fpr, tpr, target: float) -> float:
    f = np.asarray(fpr, dtype=np.float64)
    t = np.asarray(tpr, dtype=np.float64)
    ok = f <= target
    return float(t[ok].max()) if ok.any() else 0.0


def lira_by_group(lira, membership, groups) -> dict:
    s = np.asarray(lira, dtype=np.float64)
    m = np.asarray(membership).astype(bool)
    values, idx = _group_index(groups, s.shape[1])
    out = {}
    for v, ix in zip(values, idx):
        fpr, tpr = roc_curve_points(s[:, ix], m[:, ix])
        out[v] = {
            "auc": auc(fpr, tpr),
            "tpr_at_0.1%": tpr_at_fpr(fpr, tpr, 0.001),
            "tpr_at_1%": tpr_at_fpr(fpr, tpr, 0.01),
        }
    return out


def _cp_upper(k, n, alpha):
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ub = _sps.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, ub)


def _eps_from_rates(fpr_hi, fnr_hi, delta):
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(1.0 - delta - fpr_hi) - np.log(fnr_hi)
        b = np.log(1.0 - delta - fnr_hi) - np.log(fpr_hi)
    a = np.where(np.isnan(a), -np.inf, a)
    b = np.where(np.isnan(b), -np.inf, b)
    return np.maximum(np.maximum(a, b), 0.0)


def epsilon_lower_bound(tp, fn, fp, tn, *, delta: float, confidence: float = 0.95) -> float:
    tp, fn, fp, tn = (int(x) for x in (tp, fn, fp, tn))
    if min(tp, fn, fp, tn) < 0 or tp + fn == 0 or fp + tn == 0:
        raise ValueError("need non-negative counts with at least one member and one non-member trial")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = _cp_upper(fp, fp + tn, alpha)
    fnr_hi = _cp_upper(fn, tp + fn, alpha)
    return float(_eps_from_rates(fpr_hi, fnr_hi, delta))


def per_group_epsilon_lower_bound(
    scores, membership, groups, *, delta: float, confidence: float = 0.95,
    seed=0, max_thresholds: int = 512,
) -> dict:
    s, m = _as_pair(scores, membership)
    values, idx = _group_index(groups, s.shape[1])
    rng = np.random.default_rng(seed)
    ia, ib = _split_models(m, rng)
    alpha = (1.0 - confidence) / 2.0
    out = {}
    for v, ix in zip(values, idx):
        sa, ma = s[np.ix_(ia, ix)].ravel(), m[np.ix_(ia, ix)].ravel()
        sb, mb = s[np.ix_(ib, ix)].ravel(), m[np.ix_(ib, ix)].ravel()
        pos_a, neg_a = np.sort(sa[ma]), np.sort(sa[~ma])
        uniq = np.unique(sa)
        if uniq.size > max_thresholds:
            uniq = np.unique(uniq[np.linspace(0, uniq.size - 1, max_thresholds).round().astype(int)])
        cand = uniq  # rule: member if score >= t
        tp_a = pos_a.size - np.searchsorted(pos_a, cand, side="left")
        fp_a = neg_a.size - np.searchsorted(neg_a, cand, side="left")
        if pos_a.size and neg_a.size:
            eps_a = _eps_from_rates(
                _cp_upper(fp_a, neg_a.size, alpha), _cp_upper(pos_a.size - tp_a, pos_a.size, alpha), delta
            )
            t = float(cand[int(np.argmax(eps_a))])
        else:
            t = float("inf")
        pred = sb >= t
        tp = int(np.count_nonzero(pred & mb))
        fn = int(np.count_nonzero(~pred & mb))
        fp = int(np.count_nonzero(pred & ~mb))
        tn = int(np.count_nonzero(~pred & ~mb))
        if tp + fn and fp + tn:
            eps = epsilon_lower_bound(tp, fn, fp, tn, delta=delta, confidence=confidence)
            tpr, fpr = tp / (tp + fn), fp / (fp + tn)
        else:
            eps, tpr, fpr = float("nan"), float("nan"), float("nan")
        out[v] = {"tp": tp, "fn": fn, "fp": fp, "tn": tn, "threshold": t,
                  "tpr": tpr, "fpr": fpr, "epsilon_lb": eps}
    return out


OLD = SimpleNamespace(**{name: globals()[name] for name in (
    "sample_advantage", "bootstrap_gpr", "null_floor", "null_distribution", "pa_ga", "pa_gba", "pa_looa",
    "lira_scores", "roc_curve_points", "lira_by_group", "per_group_epsilon_lower_bound", "epsilon_lower_bound")})


if __name__ == "__main__":
    if "--write" in sys.argv:
        write_fixture(Path(sys.argv[sys.argv.index("--write") + 1]) if len(sys.argv) > 2 else FIXTURE)
    elif "--time" in sys.argv:
        time_side_by_side(sys.argv[sys.argv.index("--real") + 1] if "--real" in sys.argv else None)
    else:
        print(__doc__)


@pytest.mark.slow  # 12 s: the statistics on 1 and 2 threads; the fixture tests above check the numbers themselves fast
def test_the_numbers_do_not_depend_on_the_number_of_threads():
    """Every statistic bit for bit equal on 1 thread and on 3, on an audit large enough for several blocks in
    both sorted layouts and several ROC pieces (each block writes its own rows; sums run in block order)."""
    import threading

    rng = np.random.default_rng(17)
    n = 60_000
    m = complementary_membership(n, 6, seed=3)
    s = np.round(rng.standard_normal(m.shape) + rng.uniform(0, 1.5, size=n)[None, :] * m, 2)  # ties too
    g = rng.integers(0, 2, size=n)
    x = {"scores": s, "membership": m, "groups": g, "tiers": rng.integers(0, 2, size=n), "conf": s}
    assert len(thresholds._Sorted(s.T).blocks) >= 3 and len(thresholds._Sorted(s, keep_values=False).blocks) >= 3
    assert min(m[:, g == v].sum() for v in (0, 1)) > thresholds._BLOCK_ELEMS  # each group's ROC has several pieces
    old = new.set_threads(1)
    try:
        one = compute(new, x, full=False)
        new.set_threads(3)
        three = compute(new, x, full=False)
        assert any(t.name.startswith("audit-stats") for t in threading.enumerate())  # the pool did run
    finally:
        new.set_threads(old)
    assert sorted(one[0]) == sorted(three[0])
    for k in one[0]:
        assert np.array_equal(one[0][k], three[0][k], equal_nan=one[0][k].dtype.kind == "f"), k
    assert json.dumps(_norm(one[1]), sort_keys=True) == json.dumps(_norm(three[1]), sort_keys=True)
    with pytest.raises(ValueError, match="threads"):
        new.set_threads(0)


@pytest.mark.parametrize("layout", ["samples", "models"])
def test_the_kept_sort_is_not_reused_for_an_array_changed_in_place(layout):
    """The last sort is kept for the same array; after an in-place change (here in the last block only) the
    statistics sort again and equal those of a fresh copy."""
    rng = np.random.default_rng(5)
    m = complementary_membership(30_000, 6, seed=1)
    s = rng.standard_normal(m.shape) + m
    f = (lambda x: new.sample_advantage(x, m)) if layout == "samples" else (lambda x: new.pa_gba(x, m, m[0]))
    before = f(s)
    if layout == "samples":
        s[:, -5:] = -s[:, -5:]  # reorders the last samples' models
    else:
        s[-1] = -s[-1]  # reorders the last model's samples
    got, exp = f(s), f(s.copy())

    def text(r):
        return json.dumps(_norm(r if isinstance(r, dict) else r.tolist()))

    assert text(got) == text(exp)
    assert text(before) != text(exp)  # the change matters: the old order would give other numbers
