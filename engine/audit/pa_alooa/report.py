"""The typed audit report: built once from the models' scores and the membership design, read by the
CLI tables, the figures and the page through attributes and tidy frames (never key paths).

    AuditReport             one audit: sizes, groups, tiers, timing, one AlgorithmReport per algorithm
      .algorithms[k]        AlgorithmReport: gpr (per group, with CI), delta (pp, bias-corrected, with CI; the
                            plug-in max − min GPR beside it: delta_plug_in), null_floor,
                            null_groups (each group's own null floor), null_delta (the null Δ spread),
                            resolved (Δ's CI above the null Δ spread),
                            baselines (PA-GA, PA-GBA, PA-LOOA), accuracy, lira (per group AUC + ROC),
                            epsilon (per tier: claimed ε, empirical lower bound), histogram, plan, timing;
                            control (ControlInfo: a noise- or accuracy-matched DP-SGD control of DP-SGD-S);
                            DP-SGD-S's realised noise multiplier and noise_ratio vs DP-SGD at the same ε
      .comparisons          PairedComparison: DP-SGD-S − DP-SGD / − each control, Δ, GPR and accuracy
                            differences with paired bootstrap CIs (engine.audit.pa_alooa.controls.compare)
      .gpr_frame() …        tidy pandas frames (engine.audit.pa_alooa.frames): gpr, delta, accuracy, epsilon, roc,
                            histogram, baselines, comparison
      .to_dict() / from_dict(d)   the JSON results dict the run store keeps as the audit's summary
                            (RESULTS_VERSION 3; a running audit's partial summary too)

``from_dict(to_dict(r)) == r``. Values that are undefined (an empty group, no finite score) are None;
reports of version 1 (no per-group null, no null Δ) load with those None; those of versions 1 and 2 hold the
plug-in Δ with the percentile interval of its bootstrap (delta_plug_in None). An algorithm without a
formal guarantee (``formal_dp`` False) has claimed ε None in every tier, in every output.
The report is computed in :mod:`engine.audit.pa_alooa.analysis`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from engine.audit.pa_alooa import frames
from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.pa_alooa.records import (Accuracy, Baselines, ControlInfo, Estimate, Histogram, LiraGroup, LooaRecord,
                                           PairedComparison, TierEpsilon, estimate_dict, estimate_of, from_known)
from engine.audit.pa_alooa.stats import DELTA_METHOD, DELTA_METHOD_BEFORE

RESULTS_VERSION = 3  # 2: float64 scores (logit confidence by default), per-group null floors, the null Δ, resolved;
# 3: Δ bias-corrected with the bootstrap (stats.DELTA_METHOD), the plug-in beside it, paired Δ differences alike


# ================================================================================================
# the report types (their parts: engine.audit.pa_alooa.records)
# ================================================================================================

@dataclass(frozen=True)
class AlgorithmReport:
    key: str
    name: str
    label: str
    formal_dp: bool
    gpr: dict  # group -> Estimate (value = the group's mean per-sample advantage)
    delta: Estimate  # (max − min GPR) × 100, in pp, bias-corrected (stats.DELTA_METHOD); version ≤ 2: the plug-in
    null_floor: float | None
    baselines: Baselines
    accuracy: Accuracy
    lira: dict  # group -> LiraGroup
    epsilon: tuple[TierEpsilon, ...]
    histogram: Histogram
    algorithm: dict = field(default_factory=dict)  # the AlgorithmConfig as JSON
    plan: tuple[dict, ...] | None = None  # per tier: sample_rate, clip_norm, noise, ε
    info: dict = field(default_factory=dict)
    advantage_mean: float | None = None
    n_boot: int | None = None
    ci: float | None = None
    epsilon_confidence: float | None = None
    epsilon_delta: float | None = None
    train_seconds: float | None = None
    stats_seconds: float | None = None
    null_groups: dict = field(default_factory=dict)  # group -> the GPR under permuted membership (its own floor)
    null_delta: Estimate | None = None  # Δ under permuted membership: mean and spread (pp); None in version 1
    null_perms: int | None = None
    resolved: bool | None = None  # Δ's CI low above the null Δ spread's high; None: not computed
    control: ControlInfo | None = None  # a control of DP-SGD-S (AuditConfig.controls)
    # DP-SGD-S: the gradient noise multiplier it realised (noise std / C, mean over steps and models) and σ of
    # DP-SGD at the same ε; their ratio is its extra noise
    realised_noise_multiplier: float | None = None
    dpsgd_noise_multiplier: float | None = None
    accuracy_ci: Estimate | None = None  # mean test accuracy in points, t interval over complementary pairs
    delta_plug_in: float | None = None  # (max − min GPR) × 100 before the bias correction; None: version ≤ 2

    @property
    def noise_ratio(self) -> float | None:
        """DP-SGD-S's mean noise std over DP-SGD's at the same ε: z_Δ · mean max_k C_k / (σ · C)."""
        if self.realised_noise_multiplier is None or not self.dpsgd_noise_multiplier:
            return None
        return self.realised_noise_multiplier / self.dpsgd_noise_multiplier

    def to_dict(self) -> dict:
        b = self.baselines
        baselines = {"pa_ga": b.pa_ga, "pa_gba": dict(b.pa_gba)}
        if b.pa_looa is not None:
            baselines.update(pa_looa=[dataclasses.asdict(r) for r in b.pa_looa], looa_models=b.looa_models,
                             looa_models_per_record=b.looa_models_per_record)
        out = {"key": self.key, "name": self.name, "label": self.label, "formal_dp": self.formal_dp,
               "algorithm": dict(self.algorithm), "plan": None if self.plan is None else [dict(p) for p in self.plan],
               "info": dict(self.info),
               "gpr": {"groups": {g: {"mean": e.value, "low": e.low, "high": e.high} for g, e in self.gpr.items()},
                       "delta": {"value": self.delta.value, "low": self.delta.low, "high": self.delta.high,
                                 **({} if self.delta_plug_in is None else {"plug_in": self.delta_plug_in})},
                       "n_boot": self.n_boot, "ci": self.ci},
               "null_floor": self.null_floor, "advantage_mean": self.advantage_mean, "baselines": baselines,
               "null": {"groups": dict(self.null_groups), "n_perm": self.null_perms,
                        "delta": None if self.null_delta is None else
                        {"value": self.null_delta.value, "low": self.null_delta.low, "high": self.null_delta.high}},
               "resolved": self.resolved,
               "accuracy": {"mean": self.accuracy.mean, "std": self.accuracy.std, "min": self.accuracy.min,
                            "max": self.accuracy.max, "groups": dict(self.accuracy.groups)},
               "lira": {"groups": {g: {"auc": v.auc, "tpr_at_0.1%": v.tpr_at_0_1pct, "tpr_at_1%": v.tpr_at_1pct}
                                   for g, v in self.lira.items()},
                        "roc": {g: {"fpr": list(v.roc_fpr), "tpr": list(v.roc_tpr)} for g, v in self.lira.items()}},
               "epsilon": {"tiers": [dataclasses.asdict(t) for t in self.epsilon],
                           "confidence": self.epsilon_confidence, "delta": self.epsilon_delta},
               "histogram": {"edges": list(self.histogram.edges),
                             "counts": {g: list(c) for g, c in self.histogram.counts.items()}}}
        for k in ("train_seconds", "stats_seconds", "realised_noise_multiplier", "dpsgd_noise_multiplier"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.control is not None:
            out["control"] = self.control.to_dict()
        if self.accuracy_ci is not None:
            out["accuracy_ci"] = estimate_dict(self.accuracy_ci)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "AlgorithmReport":
        g = d.get("gpr") or {}
        b = d.get("baselines") or {}
        acc = d.get("accuracy") or {}
        lira = d.get("lira") or {}
        rocs = lira.get("roc") or {}
        eps = d.get("epsilon") or {}
        hist = d.get("histogram") or {}
        looa = b.get("pa_looa")
        null = d.get("null") or {}
        nd = null.get("delta")
        return cls(
            key=d["key"], name=d.get("name", d["key"]), label=d.get("label", d["key"]),
            formal_dp=bool(d.get("formal_dp")),
            gpr={k: Estimate(v.get("mean"), v.get("low"), v.get("high")) for k, v in (g.get("groups") or {}).items()},
            delta=Estimate(*(((g.get("delta") or {}).get(k)) for k in ("value", "low", "high"))),
            null_floor=d.get("null_floor"),
            baselines=Baselines(pa_ga=b.get("pa_ga"), pa_gba=dict(b.get("pa_gba") or {}),
                                pa_looa=None if looa is None else tuple(from_known(LooaRecord, r) for r in looa),
                                looa_models=b.get("looa_models"),
                                looa_models_per_record=b.get("looa_models_per_record")),
            accuracy=Accuracy(acc.get("mean"), acc.get("std"), acc.get("min"), acc.get("max"),
                              dict(acc.get("groups") or {})),
            lira={k: LiraGroup(v.get("auc"), v.get("tpr_at_0.1%"), v.get("tpr_at_1%"),
                               tuple((rocs.get(k) or {}).get("fpr") or ()), tuple((rocs.get(k) or {}).get("tpr") or ()))
                  for k, v in (lira.get("groups") or {}).items()},
            epsilon=tuple(from_known(TierEpsilon, t) for t in eps.get("tiers") or ()),
            histogram=Histogram(tuple(hist.get("edges") or ()),
                                {k: tuple(c) for k, c in (hist.get("counts") or {}).items()}),
            algorithm=dict(d.get("algorithm") or {}),
            plan=None if d.get("plan") is None else tuple(dict(p) for p in d["plan"]),
            info=dict(d.get("info") or {}), advantage_mean=d.get("advantage_mean"), n_boot=g.get("n_boot"),
            ci=g.get("ci"), epsilon_confidence=eps.get("confidence"), epsilon_delta=eps.get("delta"),
            train_seconds=d.get("train_seconds"), stats_seconds=d.get("stats_seconds"),
            null_groups=dict(null.get("groups") or {}), null_perms=null.get("n_perm"),
            null_delta=None if nd is None else Estimate(nd.get("value"), nd.get("low"), nd.get("high")),
            resolved=d.get("resolved"),
            control=None if d.get("control") is None else ControlInfo.from_dict(d["control"]),
            realised_noise_multiplier=d.get("realised_noise_multiplier"),
            dpsgd_noise_multiplier=d.get("dpsgd_noise_multiplier"),
            accuracy_ci=None if d.get("accuracy_ci") is None else estimate_of(d["accuracy_ci"]),
            delta_plug_in=(g.get("delta") or {}).get("plug_in"))

    def claimed_epsilons(self) -> tuple:
        """Per tier: the claimed ε, None for every tier of an algorithm without a formal guarantee."""
        return tuple(t.claimed if self.formal_dp else None for t in self.epsilon)


@dataclass(frozen=True)
class AuditReport:
    dataset: str
    n_train: int
    R: int
    n_models: int
    threshold: str
    group_by: str
    group_names: tuple[str, ...]
    group_sizes: dict  # group -> training samples
    tier_names: tuple[str, ...]
    tier_sizes: tuple[int, ...]
    algorithms: tuple[AlgorithmReport, ...] = ()
    config: dict = field(default_factory=dict)  # the AuditConfig as JSON (as stored; see audit_config)
    steps_per_model: int | None = None
    device: str | None = None
    chunk_models: int | None = None
    seconds: float | None = None
    train_seconds: float | None = None
    stats_seconds: float | None = None
    partial: bool = False  # a running (or stopped) audit: not every algorithm is there yet
    version: int = RESULTS_VERSION
    score: str | None = None  # logit_confidence | loss; None: a version-1 report (float32 −loss)
    comparisons: tuple[PairedComparison, ...] = ()  # DP-SGD-S against DP-SGD and its controls, paired

    @property
    def audit_config(self):
        """The typed AuditConfig (configs stored in the earlier flat shape are migrated)."""
        return AuditConfig.from_dict(self.config)

    def algorithm(self, key: str) -> AlgorithmReport:
        for a in self.algorithms:
            if a.key == key:
                return a
        raise KeyError(f"no algorithm {key!r} in this audit; there are: {', '.join(a.key for a in self.algorithms)}")

    @property
    def delta_bias_corrected(self) -> bool:
        """Whether Δ is bias-corrected (version 3 on: a plug-in beside each Δ; an audit with no algorithm yet will
        be)."""
        return not self.algorithms or any(a.delta_plug_in is not None for a in self.algorithms)

    @property
    def delta_method(self) -> str:
        """How this report's Δ and its CI were estimated, in words: ``stats.DELTA_METHOD``; a report stored before the
        bias correction says what it holds instead."""
        if self.delta_bias_corrected:
            return DELTA_METHOD
        return f"Δ here is {DELTA_METHOD_BEFORE} (an audit stored before Δ was bias-corrected)"

    def at_null_floor(self) -> list[str]:
        """Labels of the algorithms, when ALL of them have every group's GPR CI reaching down to that group's
        own null floor (the audit measured no leakage at all); else []."""
        out = []
        for a in self.algorithms:
            known = [(e.low, a.null_groups.get(g, a.null_floor)) for g, e in a.gpr.items()]
            known = [(lo, f) for lo, f in known if lo is not None and f is not None]
            if known and all(lo <= f for lo, f in known):
                out.append(a.label)
        return out if out and len(out) == len(self.algorithms) else []

    # --- tidy frames (what the figures, CSV exports and tables show) ---------------------------------
    def gpr_frame(self):
        return _frames().gpr_frame(self)

    def delta_frame(self):
        return _frames().delta_frame(self)

    def accuracy_frame(self):
        return _frames().accuracy_frame(self)

    def epsilon_frame(self):
        return _frames().epsilon_frame(self)

    def roc_frame(self):
        return _frames().roc_frame(self)

    def histogram_frame(self):
        return _frames().histogram_frame(self)

    def baselines_frame(self):
        return _frames().baselines_frame(self)

    def comparison_frame(self):
        return _frames().comparison_frame(self)

    # --- the store's JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {"kind": "audit", "version": self.version, "config": self.config, "dataset": self.dataset,
               "n_train": self.n_train, "R": self.R, "n_models": self.n_models, "steps_per_model": self.steps_per_model,
               "threshold": self.threshold, "group_by": self.group_by, "group_names": list(self.group_names),
               "group_sizes": dict(self.group_sizes), "tier_names": list(self.tier_names),
               "tier_sizes": list(self.tier_sizes), "device": self.device, "chunk_models": self.chunk_models,
               "algorithms": [a.to_dict() for a in self.algorithms]}
        for k in ("seconds", "train_seconds", "stats_seconds"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.partial:
            out["partial"] = True
        if self.score is not None:
            out["score"] = self.score
        if self.comparisons:
            out["comparisons"] = [c.to_dict() for c in self.comparisons]
        return json_clean(out)

    @classmethod
    def from_dict(cls, d: dict) -> "AuditReport":
        """An audit's results dict (the run's summary, finished or partial) as a report."""
        if isinstance(d, AuditReport):
            return d
        if not isinstance(d, dict) or d.get("kind", "audit") != "audit":
            raise ValueError("not an audit results dict")
        return cls(dataset=d.get("dataset", ""), n_train=d.get("n_train", 0), R=d.get("R", 0),
                   n_models=d.get("n_models", 0), threshold=d.get("threshold", ""), group_by=d.get("group_by", ""),
                   group_names=tuple(d.get("group_names") or ()), group_sizes=dict(d.get("group_sizes") or {}),
                   tier_names=tuple(d.get("tier_names") or ()), tier_sizes=tuple(d.get("tier_sizes") or ()),
                   algorithms=tuple(AlgorithmReport.from_dict(a) for a in d.get("algorithms") or ()),
                   config=dict(d.get("config") or {}), steps_per_model=d.get("steps_per_model"),
                   device=d.get("device"), chunk_models=d.get("chunk_models"), seconds=d.get("seconds"),
                   train_seconds=d.get("train_seconds"), stats_seconds=d.get("stats_seconds"),
                   partial=bool(d.get("partial", False)), version=d.get("version", 1), score=d.get("score"),
                   comparisons=tuple(PairedComparison.from_dict(c) for c in d.get("comparisons") or ()))

    def comparison(self, a: str, b: str) -> PairedComparison | None:
        """The paired comparison of algorithm keys ``a`` against ``b``; None when the audit has none."""
        return next((c for c in self.comparisons if c.a == a and c.b == b), None)

    def dpsgd_comparison(self, key: str) -> PairedComparison | None:
        """Algorithm ``key`` (DP-SGD-S) against plain DP-SGD — not against one of its controls; None without one."""
        return next((c for c in self.comparisons if c.a == key and self.algorithm(c.b).control is None), None)

    def controls_of(self, key: str) -> dict:
        """The controls of the DP-SGD-S algorithm ``key``: {kind: AlgorithmReport}."""
        return {a.control.kind: a for a in self.algorithms if a.control is not None and a.control.of == key}


def _frames():
    return frames


def as_report(results) -> AuditReport:
    """An AuditReport from a report or a stored results dict."""
    return results if isinstance(results, AuditReport) else AuditReport.from_dict(results)


def json_clean(x):
    """JSON-safe: numpy scalars → Python, NaN/±inf → None, keys → str."""
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_clean(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
