"""The audit report's parts, each a typed record with ``from_dict(to_dict(x)) == x`` (``report.py`` composes them
into AlgorithmReport and AuditReport):

    Estimate           a value with its CI (GPR, Δ, differences)
    TierEpsilon        one tier's claimed ε and empirical lower bound with the counts behind it
    LooaRecord, Baselines   PA-LOOA per record; PA-GA, PA-GBA, PA-LOOA
    Accuracy, LiraGroup, Histogram
    ControlInfo        a DP-SGD-S control (noise- or accuracy-matched DP-SGD): what it was planned from
    PairedComparison   DP-SGD-S − DP-SGD (or − a control) with paired bootstrap CIs
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap confidence interval (None where undefined)."""

    value: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class TierEpsilon:
    """One privacy tier: the ε the plan guarantees and the audit's empirical lower bound."""

    name: str
    claimed: float | None  # None: no formal guarantee (non-private)
    target: float | None
    lower_bound: float | None
    tpr: float | None = None
    fpr: float | None = None
    tp: int | None = None
    fn: int | None = None
    fp: int | None = None
    tn: int | None = None


@dataclass(frozen=True)
class LooaRecord:
    """PA-LOOA on one record, next to its PA-ALOOA advantage."""

    index: int
    group: str
    looa_advantage: float | None
    aloo_advantage: float | None


@dataclass(frozen=True)
class Baselines:
    pa_ga: float | None
    pa_gba: dict  # group -> advantage
    pa_looa: tuple[LooaRecord, ...] | None = None  # None: PA-LOOA not run (looa_k = 0)
    looa_models: int | None = None
    looa_models_per_record: int | None = None


@dataclass(frozen=True)
class Accuracy:
    """Test accuracy over the models: mean, sd, range, and the mean per group (where test groups exist)."""

    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    groups: dict = field(default_factory=dict)  # group -> accuracy


@dataclass(frozen=True)
class LiraGroup:
    auc: float | None
    tpr_at_0_1pct: float | None
    tpr_at_1pct: float | None
    roc_fpr: tuple[float, ...] = ()
    roc_tpr: tuple[float, ...] = ()


@dataclass(frozen=True)
class Histogram:
    edges: tuple[float, ...]
    counts: dict  # group -> tuple of bin counts


@dataclass(frozen=True)
class ControlInfo:
    """A control of DP-SGD-S (``AuditConfig.controls``): DP-SGD re-planned so that one thing matches DP-SGD-S.

    noise_matched     DP-SGD at the noise multiplier DP-SGD-S realised, z_Δ · mean over steps and models of
                      max_k C_k / C; its ε is the accountant's for that multiplier (below the audit's target)
    accuracy_matched  DP-SGD at the ε whose test accuracy equals DP-SGD-S's, found by a bisection in log ε on
                      ``pilot_models`` models (the audit's first memberships and initialisations)
    """

    kind: str  # "noise_matched" | "accuracy_matched"
    of: str  # key of the DP-SGD-S algorithm it controls
    noise_multiplier: float  # the control's σ (noise std σ · C)
    epsilon: float  # the accountant's ε for σ (the audit run's accountant), every tier
    target_epsilon: float  # the ε DP-SGD-S (and DP-SGD) are planned for
    realised_noise_multiplier: float | None = None  # noise-matched: what DP-SGD-S realised
    target_accuracy: float | None = None  # accuracy-matched: DP-SGD-S's mean test accuracy on the pilot models
    search: tuple = ()  # accuracy-matched: ((ε, pilot accuracy), …) in the order tried
    matched: bool | None = None  # accuracy-matched: False when the search bracket held no crossing
    pilot_models: int | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["search"] = [list(p) for p in self.search]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ControlInfo":
        d = dict(d)
        d["search"] = tuple(tuple(p) for p in d.get("search") or ())
        return from_known(cls, d)


@dataclass(frozen=True)
class PairedComparison:
    """Algorithm ``a`` against algorithm ``b`` of the same audit, paired: both trained on the same membership
    splits from the same initialisations, so every difference is resampled with the same draws (the paired
    bootstrap of ``engine.audit.pa_alooa.controls.compare``). Differences are a − b; Δ and GPR in percentage points, accuracy
    in points."""

    a: str  # algorithm keys
    b: str
    a_label: str
    b_label: str
    delta: Estimate  # Δ_a − Δ_b (pp), paired bootstrap CI
    delta_unpaired: Estimate  # the same difference with independent resamples (what two CIs side by side imply)
    groups: dict  # group -> Estimate: GPR_a − GPR_b (pp), paired
    reference_gpr: dict  # group -> GPR_b (fraction): which groups are high-risk under b
    accuracy: Estimate  # mean test accuracy a − b (points), paired over models (t interval)
    n_boot: int
    ci: float

    def to_dict(self) -> dict:
        e = estimate_dict
        return {"a": self.a, "b": self.b, "a_label": self.a_label, "b_label": self.b_label, "delta": e(self.delta),
                "delta_unpaired": e(self.delta_unpaired), "groups": {g: e(v) for g, v in self.groups.items()},
                "reference_gpr": dict(self.reference_gpr), "accuracy": e(self.accuracy), "n_boot": self.n_boot,
                "ci": self.ci}

    @classmethod
    def from_dict(cls, d: dict) -> "PairedComparison":
        e = estimate_of
        return cls(a=d["a"], b=d["b"], a_label=d.get("a_label", d["a"]), b_label=d.get("b_label", d["b"]),
                   delta=e(d.get("delta")), delta_unpaired=e(d.get("delta_unpaired")),
                   groups={g: e(v) for g, v in (d.get("groups") or {}).items()},
                   reference_gpr=dict(d.get("reference_gpr") or {}), accuracy=e(d.get("accuracy")),
                   n_boot=d.get("n_boot"), ci=d.get("ci"))


def estimate_dict(e: Estimate) -> dict:
    return {"value": e.value, "low": e.low, "high": e.high}


def estimate_of(d) -> Estimate:
    d = d or {}
    return Estimate(d.get("value"), d.get("low"), d.get("high"))


def from_known(cls, d: dict):
    """A record type from a stored dict, ignoring keys it does not know (older / newer results)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})
