"""A training run's typed records: built once by the loop (:mod:`engine.train.loop`), stored as JSON, read by
the figures, exports, experiments and pages through attributes (never key paths).

    PlanRecord              what the run is planned to do, fixed before step 1 (the run's ``plan``; also what
                            ``engine.train.loop.preview`` returns, with n_train / algorithm / seeds set):
                            steps, tiers, the planner's fields (``engine.dp.accounting.Plan``), DP-SGD-S's set-up
      .noise_multipliers    THE per-tier noise multiplier σ_k every page and table shows (see below)
      .tiers                per tier: a TierPlan (name, owners, target ε, planned ε, q, C, σ)
      .to_plan()            the planner's accounting.Plan again (None: non-private, or DP-SGD-S)
    EvalRecord              one evaluation (step, epoch, elapsed; overall, per-tier and per-class metrics,
                            fairness; the mechanism's state: INO-SGD's ρ per tier, DP-SGD-S's clips and noise)
    RunSummary              the finished run: accuracy, per-tier summary (recall AUC, MID markers), seeds, …

Each type's ``to_dict()`` is exactly the JSON the run store keeps (the format of the original layout, commit
08cf57a: stores written then open unchanged) and ``from_dict(d)`` is tolerant: a missing key gets its default,
an unknown key is kept in ``extra`` and written back, so ``to_dict(from_dict(d)) == d`` for every dict the loop
writes and ``from_dict(to_dict(r)) == r`` for every record (tests/test_records.py). Keys the writer adds only in
some runs stay absent when their field is unset (``reproducible``; ``fairness``, the mechanism's state and the
seed fields of a k-seed job; the preview's fields). Lists in JSON are tuples here; values are kept as stored
(NaN metrics of an empty tier, null ε spent without a formal guarantee).

σ_k (``PlanRecord.noise_multipliers``): the noise multiplier tier k's clipped gradients see, the step's noise
std over the tier's clip. IDP-SGD SCALE adds σ*·C to every sum and clips tier k at C_k, so tier k sees
σ*·C/C_k (``accounting.Plan.noise_multipliers``); every other planner mode shares σ*; DP-SGD-S adds
z_Δ · max_j C_j with per-group clips C_j that move every step, so its σ is z_Δ (``gradient_noise_multiplier``,
relative to the largest clip) for every tier. The audit's plan table asks the same property. DP-SGD-S's noise
against plain DP-SGD's at the same ε, (z_Δ · max_j C_j) / (σ·C), has one owner too: ``GroupClipPlan.noise_ratio``.

:func:`tier_table` / :func:`no_dp_note` are the summary's text (``python -m engine show``).
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import ClassVar

from engine.dp import accounting
from engine.dp.individual import IndividualEpsilonSummary


# ================================================================================================
# flat records: JSON keys are the fields
# ================================================================================================

class _Flat:
    """A record whose JSON is one flat dict. ``_keys``: (field, JSON key) in the order the loop writes them;
    ``_optional``: fields written only when set (not None); ``_sequences``: lists in JSON, tuples here;
    ``extra``: the keys this type does not know, kept as they are and written back. ``from_dict`` reads a
    dict in one pass (the figures convert every new evaluation of a live view)."""

    _keys: ClassVar[tuple[tuple[str, str], ...]] = ()
    _optional: ClassVar[frozenset] = frozenset()
    _sequences: ClassVar[frozenset] = frozenset()
    _field_of: ClassVar[dict] = {}  # JSON key → field (from _keys)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._field_of = {key: name for name, key in cls._keys}

    def to_dict(self) -> dict:
        return {**self._known_dict(), **self.extra}

    def _known_dict(self) -> dict:
        """The JSON of the fields in ``_keys``."""
        out = {}
        for name, key in self._keys:
            value = getattr(self, name)
            if value is None and name in self._optional:
                continue
            out[key] = list(value) if value is not None and name in self._sequences else value
        return out

    @classmethod
    def _split(cls, d: dict, skip=()) -> tuple[dict, dict]:
        """(constructor arguments of the keys of ``d`` this type knows, the other keys but ``skip``); absent keys
        are left to the defaults."""
        known, extra = {}, {}
        field_of, sequences = cls._field_of, cls._sequences
        for key, value in d.items():
            name = field_of.get(key)
            if name is not None:
                known[name] = tuple(value) if value is not None and name in sequences else value
            elif key not in skip:
                extra[key] = value
        return known, extra

    @classmethod
    def from_dict(cls, d: dict | None):
        if not d:
            return cls()
        known, extra = cls._split(d)
        return cls(**known, extra=extra)


def _same_keys(*names: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, n) for n in names)


# ================================================================================================
# evaluations
# ================================================================================================

@dataclass(frozen=True)
class OverallMetrics(_Flat):
    """Test-set metrics over all samples (engine.models.metrics.group_metrics)."""

    loss: float | None = None
    accuracy: float | None = None
    balanced_accuracy: float | None = None  # macro mean of the per-class recalls
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("loss", "accuracy", "balanced_accuracy")


@dataclass(frozen=True)
class TierMetrics(_Flat):
    """One privacy tier at one evaluation: its metrics (on the test set, or on a fixed training subsample when
    tiers are per sample: ``EvalRecord.tier_split``), its budget and the ε spent so far (None: not accounted)."""

    name: str | None = None
    epsilon: float | None = None
    epsilon_spent: float | None = None
    loss: float | None = None  # NaN: the tier has no sample in the split
    recall: float | None = None  # macro mean of the per-class recalls inside the tier
    accuracy: float | None = None
    n: int | None = None  # samples of the tier in the split
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("loss", "recall", "accuracy", "n", "name", "epsilon", "epsilon_spent")
    _optional: ClassVar = frozenset({"n"})


@dataclass(frozen=True)
class ClassMetrics(_Flat):
    """One class at one evaluation (test set): loss, recall, one-vs-rest accuracy."""

    name: str | None = None
    loss: float | None = None
    recall: float | None = None
    accuracy: float | None = None
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("loss", "recall", "accuracy", "name")


@dataclass(frozen=True)
class Fairness(_Flat):
    """Outcome fairness on the test set (binary datasets with a sensitive attribute; Fairlearn's definitions)."""

    demographic_parity_difference: float | None = None
    equalized_odds_difference: float | None = None
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("demographic_parity_difference", "equalized_odds_difference")


@dataclass(frozen=True)
class InoState(_Flat):
    """INO-SGD's diagnostics since the previous evaluation (``Importance.model_state``): the mean ρ of each tier's
    batch items (None for a tier it did not sample; the whole tuple None without per-sample tiers) and the
    fraction of the clip mass down-weighted Σ (1 − ρ_i) C_i / Σ C_i (None: nothing sampled)."""

    rho_by_tier: tuple | None = None
    downweighted_fraction: float | None = None
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = (("rho_by_tier", "ino_rho_by_tier"), ("downweighted_fraction", "ino_downweighted_fraction"))
    _sequences: ClassVar = frozenset({"rho_by_tier"})


@dataclass(frozen=True)
class GroupClipState(_Flat):
    """DP-SGD-S's clips at an evaluation (``GroupAdaptive.state``): each clip group's C_k and the step's noise
    std z_Δ · max_k C_k."""

    clip_norms: tuple | None = None
    noise_std: float | None = None
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = (("clip_norms", "group_clip_norms"), ("noise_std", "noise_std"))
    _sequences: ClassVar = frozenset({"clip_norms"})


@dataclass(frozen=True)
class GlobalScaleState(_Flat):
    """DPSGD-Global-Adapt's threshold at an evaluation (``GlobalScaling.model_state``): the privately tracked Z and
    the scale C / max(Z, C) every gradient of the next step is multiplied by (its clip and noise: ``group_clip``)."""

    threshold: float | None = None
    scale: float | None = None
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = (("threshold", "global_threshold"), ("scale", "global_scale"))


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation of one model (the loop's evaluator, every ``eval_every`` steps and at steps 0 and T)."""

    step: int = 0
    epoch: float | None = None  # step · expected batch / n_train
    elapsed: float | None = None  # seconds of training so far
    overall: OverallMetrics = field(default_factory=OverallMetrics)
    tiers: tuple[TierMetrics, ...] = ()
    classes: tuple[ClassMetrics, ...] = ()
    tier_split: str | None = None  # "test"; "train" when tiers are per sample (metrics on a training subsample)
    fairness: Fairness | None = None
    ino: InoState | None = None  # INO-SGD runs
    group_clip: GroupClipState | None = None  # DP-SGD-S runs
    global_scale: GlobalScaleState | None = None  # DPSGD-Global-Adapt runs
    # {grouping ("class", "tier", an attribute): IndividualEpsilonSummary}; None: not measured (engine.train.individual)
    individual_epsilon: dict | None = None
    extra: dict = field(default_factory=dict)

    _OWN: ClassVar = frozenset({"step", "epoch", "elapsed", "overall", "tiers", "classes", "tier_split", "fairness",
                                "individual_epsilon"})

    def to_dict(self) -> dict:
        out = {"step": self.step, "epoch": self.epoch, "elapsed": self.elapsed, "overall": self.overall.to_dict(),
               "tiers": [t.to_dict() for t in self.tiers], "classes": [c.to_dict() for c in self.classes],
               "tier_split": self.tier_split}
        if self.fairness is not None:
            out["fairness"] = self.fairness.to_dict()
        for state in (self.ino, self.group_clip, self.global_scale):
            if state is not None:
                out.update(state.to_dict())
        if self.individual_epsilon is not None:
            out["individual_epsilon"] = individual_to_dict(self.individual_epsilon)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "EvalRecord":
        own, state = {}, {}
        for k, v in (d or {}).items():
            (own if k in cls._OWN else state)[k] = v
        return cls(step=own.get("step", 0), epoch=own.get("epoch"), elapsed=own.get("elapsed"),
                   overall=OverallMetrics.from_dict(own.get("overall")),
                   tiers=tuple(TierMetrics.from_dict(t) for t in own.get("tiers") or ()),
                   classes=tuple(ClassMetrics.from_dict(c) for c in own.get("classes") or ()),
                   tier_split=own.get("tier_split"),
                   fairness=None if own.get("fairness") is None else Fairness.from_dict(own["fairness"]),
                   individual_epsilon=individual_from_dict(own.get("individual_epsilon")),
                   **cls.mechanism_fields(state))

    @staticmethod
    def mechanism_fields(state: dict) -> dict:
        """The fields ``ino``, ``group_clip``, ``global_scale`` and ``extra`` of an evaluation from the mechanism's
        state dict (``Mechanism.state()``, stored flat in the evaluation): the states this type knows, the rest kept."""
        out, rest = {"ino": None, "group_clip": None, "global_scale": None}, state
        for name, state_type in (("ino", InoState), ("group_clip", GroupClipState),
                                 ("global_scale", GlobalScaleState)):
            if any(key in rest for key in state_type._field_of):  # the keys its mechanism writes (together)
                known, rest = state_type._split(rest)
                out[name] = state_type(**known)
        out["extra"] = dict(rest)
        return out

    @classmethod
    def of(cls, e) -> "EvalRecord":
        """``e`` as a record: an EvalRecord as it is, a stored dict through :meth:`from_dict`."""
        return e if isinstance(e, EvalRecord) else cls.from_dict(e)


def individual_to_dict(by_grouping: dict) -> dict:
    """The JSON of an ``individual_epsilon`` field: {grouping: IndividualEpsilonSummary.to_dict()}."""
    return {name: s.to_dict() for name, s in by_grouping.items()}


def individual_from_dict(d: dict | None) -> dict | None:
    """An ``individual_epsilon`` field from its JSON (None: absent, a record stored before it or opted out)."""
    return None if d is None else {name: IndividualEpsilonSummary.from_dict(s) for name, s in d.items()}


# ================================================================================================
# the summary
# ================================================================================================

@dataclass(frozen=True)
class MidMarkers(_Flat):
    """MID (minority initial drop) of one tier (engine.models.metrics.mid_markers): the first evaluation step whose
    tier loss exceeds the initial one (onset), the first later one back at or below it (end), the step of the
    largest rise and that rise. None where absent."""

    onset_step: int | None = None
    end_step: int | None = None
    peak_step: int | None = None
    peak_increase: float | None = None
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("onset_step", "end_step", "peak_step", "peak_increase")


@dataclass(frozen=True)
class TierSummary(_Flat):
    """One tier at the end of the run: its last evaluation's metrics, the recall AUC over the run
    (engine.models.metrics.recall_auc) and its MID markers."""

    name: str | None = None
    epsilon: float | None = None
    epsilon_spent: float | None = None
    recall: float | None = None
    accuracy: float | None = None
    loss: float | None = None
    recall_auc: float | None = None
    mid: MidMarkers | None = None
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("name", "epsilon", "epsilon_spent", "recall", "accuracy", "loss", "recall_auc")

    def to_dict(self) -> dict:
        out = self._known_dict()
        out["mid"] = None if self.mid is None else self.mid.to_dict()
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "TierSummary":
        d = d or {}
        known, extra = cls._split(d, skip=("mid",))
        mid = d.get("mid")
        return cls(**known, mid=None if mid is None else MidMarkers.from_dict(mid), extra=extra)


@dataclass(frozen=True)
class RunSummary:
    """One model's finished run (row j of a k-seed job: seed = base + j)."""

    algorithm: str | None = None
    label: str | None = None
    steps: int | None = None  # steps trained
    planned_steps: int | None = None  # T the privacy plan is made for (≥ steps with train_epochs)
    seconds: float | None = None
    formal_dp: bool = True
    formal_dp_reason: str | None = None  # why there is no formal guarantee (then every ε spent is None)
    accuracy: float | None = None
    balanced_accuracy: float | None = None
    loss: float | None = None
    tiers: tuple[TierSummary, ...] = ()
    class_recall: tuple = ()
    fairness: Fairness | None = None
    seed: int | None = None
    seed_index: int | None = None  # k-seed jobs only (with seeds)
    seeds: int | None = None
    # the step from which a tier's test loss diverged (engine.models.metrics.diverged_at; the run ends "diverged")
    diverged_step: int | None = None
    # the last evaluation's individual ε per grouping (EvalRecord.individual_epsilon); None: not measured
    individual_epsilon: dict | None = None
    extra: dict = field(default_factory=dict)

    _SCALARS: ClassVar = ("algorithm", "label", "steps", "planned_steps", "seconds", "formal_dp", "formal_dp_reason",
                          "accuracy", "balanced_accuracy", "loss")
    _OPTIONAL: ClassVar = ("seed_index", "seeds", "diverged_step")  # stored only when set
    _OWN: ClassVar = _SCALARS + ("tiers", "class_recall", "fairness", "seed", "individual_epsilon") + _OPTIONAL

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self._SCALARS}
        out.update(tiers=[t.to_dict() for t in self.tiers], class_recall=list(self.class_recall),
                   fairness=None if self.fairness is None else self.fairness.to_dict(), seed=self.seed)
        for k in self._OPTIONAL:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.individual_epsilon is not None:
            out["individual_epsilon"] = individual_to_dict(self.individual_epsilon)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "RunSummary":
        d = d or {}
        scalars = {k: d[k] for k in cls._SCALARS if k in d}
        return cls(**scalars, tiers=tuple(TierSummary.from_dict(t) for t in d.get("tiers") or ()),
                   class_recall=tuple(d.get("class_recall") or ()),
                   fairness=None if d.get("fairness") is None else Fairness.from_dict(d["fairness"]),
                   seed=d.get("seed"), **{k: d.get(k) for k in cls._OPTIONAL},
                   individual_epsilon=individual_from_dict(d.get("individual_epsilon")),
                   extra={k: v for k, v in d.items() if k not in cls._OWN})

    @classmethod
    def of(cls, s) -> "RunSummary":
        """``s`` as a summary: a RunSummary as it is, a stored dict through :meth:`from_dict`."""
        return s if isinstance(s, RunSummary) else cls.from_dict(s)


# ================================================================================================
# the plan
# ================================================================================================

@dataclass(frozen=True)
class GroupClipPlan(_Flat):
    """DP-SGD-S's set-up, fixed before step 1 (``engine.dp.prepare.PrivacyPlan.info``): what it uses instead of a
    noise std and per-tier clips (those move every step: ``EvalRecord.group_clip``)."""

    gradient_noise_multiplier: float | None = None  # z_Δ (private quantile) or the plan's z: noise z · max_k C_k
    dpsgd_noise_multiplier: float | None = None  # σ of plain DP-SGD at the same ε (noise σ·C); None: stored before
    count_noise_std: float | None = None  # σ_b of the clipped-count release (None: counts not privatised)
    clip_rule: str | None = None  # "quantile" | "reference"
    base_clip: float | None = None  # C: C_k = C · clamp(τ S_k / S̄, c_min, c_max)
    c_min: float | None = None
    c_max: float | None = None
    clip_groups: tuple | None = None  # the clip groups' names
    group_sizes: tuple | None = None  # public sizes: declared, or released with noise
    group_size_source: str | None = None  # "declared" | "released" | "planned" | None (no sizes used)
    group_size_noise_std: float | None = None  # σ of that release (None: declared)
    expected_group_batch: tuple | None = None  # public expected count of each group in a batch
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("gradient_noise_multiplier", "dpsgd_noise_multiplier", "count_noise_std", "clip_rule",
                                 "base_clip", "c_min", "c_max", "clip_groups", "group_sizes", "group_size_source",
                                 "group_size_noise_std", "expected_group_batch")
    _optional: ClassVar = frozenset({"dpsgd_noise_multiplier"})  # absent from plans stored before issue 18
    _sequences: ClassVar = frozenset({"clip_groups", "group_sizes", "expected_group_batch"})

    @property
    def dpsgd_noise_std(self) -> float | None:
        """σ·C: the noise std plain DP-SGD adds at the same ε (None: not recorded)."""
        sigma, c = self.dpsgd_noise_multiplier, self.base_clip
        return None if sigma is None or c is None else float(sigma) * float(c)

    def noise_ratio(self, noise_std) -> float | None:
        """THE ratio of DP-SGD-S's noise to DP-SGD's at the same ε: ``noise_std`` (a step's z_Δ · max_k C_k,
        ``GroupClipState.noise_std``) / (σ·C). None when unknown (a plan stored without σ, no noise std) or
        when σ·C is not positive."""
        ref = self.dpsgd_noise_std
        if noise_std is None or ref is None or not ref > 0:
            return None
        return float(noise_std) / ref

    @property
    def clip_range(self) -> str:
        """The clips' range as the plan tables say it: "[0.5, 4] × C = 1" (C_k from c_min · C to c_max · C),
        "[1, ∞) × C = 1" when unbounded above (DPSGD-Global-Adapt's threshold Z, its terms still at most C)."""
        low = "?" if self.c_min is None else f"{self.c_min:g}"
        high = "∞)" if self.c_max is None else f"{self.c_max:g}]"
        return f"[{low}, {high} × C = {'?' if self.base_clip is None else f'{self.base_clip:g}'}"

    @property
    def sizes_phrase(self) -> str | None:
        """How the group sizes its counts are divided by were made public ("declared", "released with noise σ =
        …", "planned"); None when it uses none."""
        source = self.group_size_source
        if source == "released":
            return f"released with noise σ = {self.group_size_noise_std or 0:.3g}"
        return source

    @property
    def noise_multiplier_ratio(self) -> float | None:
        """z_Δ / σ: what DP-SGD-S's own releases (clipped counts, group sizes) cost in noise multiplier, before
        the clips (None: unknown)."""
        z, sigma = self.gradient_noise_multiplier, self.dpsgd_noise_multiplier
        if z is None or sigma is None or not sigma > 0:
            return None
        return float(z) / float(sigma)


@dataclass(frozen=True)
class TierPlan:
    """One tier of a plan, as the plan tables show it. Non-private: no ε, q, C or σ (None); DP-SGD-S: no fixed
    clip (``clip_norm`` None: per group, see ``PlanRecord.group_clip``); ``epsilon`` None without a formal
    guarantee."""

    name: str
    size: int | None  # training samples (data owners) of the tier
    target_epsilon: float | None
    epsilon: float | None  # the ε the plan guarantees after its steps (under the plan's accountant)
    sample_rate: float | None  # q_k
    clip_norm: float | None  # C_k
    noise_multiplier: float | None  # σ_k (PlanRecord.noise_multipliers)


# the planner's fields (accounting.Plan.to_dict, in its order): written all together, when there is a plan
_PLANNER = ("mode", "noise_multiplier", "sample_rates", "clip_norms", "noise_std", "epsilons", "delta", "notes",
            "release_noise_multipliers", "accountant")
_PREVIEW = ("n_train", "algorithm", "seeds")


@dataclass(frozen=True)
class PlanRecord(_Flat):
    """The plan of a run, fixed before step 1 — the run's stored ``plan``, and what ``preview(config)`` returns
    (then also ``n_train``, ``algorithm``, ``seeds``). ``mode`` None: a non-private run (no planner fields);
    DP-SGD-S: ``group_clip`` set, ``clip_norms`` / ``noise_std`` None; no formal guarantee: ``epsilons`` None."""

    steps: int = 0  # T the plan is made for
    trained_steps: int | None = None  # steps the run trains (train_epochs: the first ones of T)
    expected_batch_size: float | None = None  # Σ q_k N_k
    tier_names: tuple[str, ...] = ()
    tier_sizes: tuple[int, ...] = ()
    target_epsilons: tuple[float, ...] = ()
    formal_dp: bool = True
    formal_dp_reason: str | None = None
    tail_length: float | None = None  # INO-SGD's γ (clip-mass units), fixed once
    reproducible: bool | None = None  # False: sampling and noise from OS entropy (secure_rng); None: reproducible
    # the planner's (engine.dp.accounting.Plan)
    mode: str | None = None  # "dpsgd" | "scale" | "sample"; None: non-private
    noise_multiplier: float | None = None  # σ*
    sample_rates: tuple[float, ...] | None = None  # q_k per tier
    clip_norms: tuple[float, ...] | None = None  # C_k per tier (None: DP-SGD-S)
    noise_std: float | None = None  # σ*·C (None: DP-SGD-S)
    epsilons: tuple[float, ...] | None = None  # planned ε per tier (None: no formal guarantee)
    delta: float | None = None
    notes: tuple[str, ...] | None = None
    release_noise_multipliers: tuple[float, ...] | None = None
    accountant: str | None = None  # whose ε `epsilons` are (engine.dp.accountants); None: stored before it, RDP
    group_clip: GroupClipPlan | None = None  # DP-SGD-S's set-up
    # the preview's (not stored)
    n_train: int | None = None
    algorithm: str | None = None
    seeds: int | None = None  # models the job trains, each on this plan
    extra: dict = field(default_factory=dict)

    _keys: ClassVar = _same_keys("steps", "trained_steps", "expected_batch_size", "tier_names", "tier_sizes",
                                 "target_epsilons", "formal_dp", "formal_dp_reason", "tail_length", "reproducible")
    _optional: ClassVar = frozenset({"reproducible"})
    _sequences: ClassVar = frozenset({"tier_names", "tier_sizes", "target_epsilons", "sample_rates", "clip_norms",
                                      "epsilons", "notes", "release_noise_multipliers"})

    def __post_init__(self):
        if self.mode is None and any(getattr(self, k) is not None for k in _PLANNER):
            raise ValueError("a plan record without a planner mode (non-private) has no planner fields")

    # --- the store's JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        out = self._known_dict()
        if self.mode is not None:
            for k in _PLANNER:
                v = getattr(self, k)
                if k == "accountant" and v is None:
                    continue  # a plan stored before the choice (RDP) stays as it was
                out[k] = list(v) if v is not None and k in self._sequences else v
        if self.group_clip is not None:
            out.update(self.group_clip.to_dict())
        for k in _PREVIEW:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "PlanRecord":
        known, rest = cls._split(d or {})
        if "mode" in rest:  # the planner's fields, written together
            for k in _PLANNER:
                v = rest.pop(k, None)
                known[k] = tuple(v) if v is not None and k in cls._sequences else v
        if any(key in rest for key in GroupClipPlan._field_of):  # DP-SGD-S's set-up (written together)
            group, rest = GroupClipPlan._split(rest)
            known["group_clip"] = GroupClipPlan(**group)
        for k in _PREVIEW:
            if k in rest:
                known[k] = rest.pop(k)
        return cls(**known, extra=rest)

    @classmethod
    def of(cls, p) -> "PlanRecord":
        """``p`` as a plan record: a PlanRecord as it is, a stored dict through :meth:`from_dict`."""
        return p if isinstance(p, PlanRecord) else cls.from_dict(p)

    # --- the writer -------------------------------------------------------------------------------------
    @classmethod
    def from_privacy(cls, privacy, tiers, *, steps: int, trained_steps: int | None = None,
                     secure_rng: bool = False, **preview) -> "PlanRecord":
        """The record of a privacy plan (``engine.dp.prepare.PrivacyPlan``) for ``tiers`` (names, sizes, ε):
        the planner's steps, tier sizes, targets and expected batch where there is a plan (the audit plans for
        half-size tiers), ``steps`` and ``tiers`` otherwise; ``preview``: n_train, algorithm, seeds."""
        plan, group = privacy.plan, privacy.clip_setup
        base = dict(steps=steps, trained_steps=trained_steps or steps, expected_batch_size=privacy.expected_batch,
                    tier_names=tuple(tiers.names), tier_sizes=tuple(tiers.sizes), target_epsilons=tuple(tiers.epsilons),
                    formal_dp=privacy.formal_dp, formal_dp_reason=privacy.formal_dp_reason,
                    tail_length=privacy.tail_length, reproducible=False if secure_rng else None, **preview)
        if plan is None:
            return cls(**base)
        base.update(steps=plan.steps, tier_sizes=tuple(plan.tier_sizes), target_epsilons=tuple(plan.target_epsilons),
                    expected_batch_size=plan.expected_batch_size)
        return cls(**base, mode=plan.mode, noise_multiplier=plan.noise_multiplier,
                   sample_rates=tuple(plan.sample_rates),
                   clip_norms=None if group is not None else tuple(plan.clip_norms),
                   noise_std=None if group is not None else plan.noise_std,
                   epsilons=tuple(plan.epsilons) if privacy.formal_dp else None, delta=plan.delta,
                   notes=tuple(plan.notes), release_noise_multipliers=tuple(plan.release_noise_multipliers),
                   accountant=plan.accountant,
                   group_clip=None if group is None else GroupClipPlan.from_dict(privacy.info))

    # --- what it means ---------------------------------------------------------------------------------
    @property
    def private(self) -> bool:
        """There is a privacy plan (clipping and noise); False for the non-private reference."""
        return self.mode is not None

    @property
    def noise_multipliers(self) -> tuple[float, ...] | None:
        """σ_k per tier (None: non-private): DP-SGD-S's z_Δ for every tier; else the planner's
        ``accounting.Plan.noise_multipliers`` (SCALE: σ*·C/C_k; σ* otherwise). See the module docstring."""
        if self.mode is None:
            return None
        if self.group_clip is not None:
            return (self.group_clip.gradient_noise_multiplier,) * len(self.sample_rates)
        return tuple(self.to_plan().noise_multipliers)

    @property
    def tiers(self) -> tuple[TierPlan, ...]:
        """One TierPlan per tier (the plan tables' rows)."""
        sigma = self.noise_multipliers
        rows = []
        for k, name in enumerate(self.tier_names):
            rows.append(TierPlan(
                name=name, size=_at(self.tier_sizes, k), target_epsilon=_at(self.target_epsilons, k),
                epsilon=_at(self.epsilons, k), sample_rate=_at(self.sample_rates, k),
                clip_norm=_at(self.clip_norms, k), noise_multiplier=_at(sigma, k)))
        return tuple(rows)

    @property
    def info(self) -> dict:
        """DP-SGD-S's set-up as a dict (``PrivacyPlan.info``; {} for every other algorithm)."""
        return {} if self.group_clip is None else self.group_clip.to_dict()

    def to_plan(self) -> accounting.Plan | None:
        """The planner's plan this record keeps (None: non-private, or DP-SGD-S, whose record keeps no clips
        and noise std); equal to the plan the run trained with."""
        if self.mode is None or self.group_clip is not None:
            return None
        return accounting.Plan(mode=self.mode, noise_multiplier=self.noise_multiplier, sample_rates=self.sample_rates,
                               clip_norms=self.clip_norms, noise_std=self.noise_std, epsilons=self.epsilons,
                               target_epsilons=self.target_epsilons, delta=self.delta, steps=self.steps,
                               tier_sizes=self.tier_sizes, expected_batch_size=self.expected_batch_size,
                               notes=self.notes or (), release_noise_multipliers=self.release_noise_multipliers or (),
                               accountant=self.accountant or "rdp")


def _at(values, k):
    return None if values is None or k >= len(values) else values[k]


# ================================================================================================
# text (python -m engine show)
# ================================================================================================

def _fmt(x, spec=".4f"):
    return "—" if x is None else format(x, spec)


def tier_table(summary) -> str:
    """The summary (a RunSummary or its stored dict) as a text table: per tier ε target / spent, recall,
    accuracy and MID markers, then the overall numbers."""
    s = RunSummary.of(summary)
    lines = [f"{'tier':<28} {'ε target':>8} {'ε spent':>8} {'recall':>7} {'acc':>7} {'MID onset':>9} {'MID end':>8}"]
    for t in s.tiers:
        mid = t.mid or MidMarkers()
        lines.append(f"{t.name[:28]:<28} {t.epsilon:>8.3g} {_fmt(t.epsilon_spent, '.3f'):>8} "
                     f"{t.recall:>7.4f} {t.accuracy:>7.4f} {str(mid.onset_step or '—'):>9} "
                     f"{str(mid.end_step or '—'):>8}")
    lines.append(f"overall accuracy {s.accuracy:.4f}, balanced accuracy {s.balanced_accuracy:.4f}, "
                 f"{s.steps} steps in {s.seconds:.1f} s"
                 + no_dp_note(s))
    return "\n".join(lines)


def individual_table(summary) -> str:
    """The summary's individual ε (``RunSummary.individual_epsilon``) as text: per grouping and group the median
    individual ε [quartiles] and the median share of the promise, the accountant named, then the data-dependence
    note; '' when the run has none (opted out, no formal guarantee, stored before it)."""
    by = RunSummary.of(summary).individual_epsilon
    if not by:
        return ""
    first = next(iter(by.values()))
    under = first.accountant.upper() + ("" if first.run_accountant == first.accountant
                                        else f"; the run's accountant is {first.run_accountant.upper()}")
    lines = [*textwrap.wrap(f"individual ε after {first.step} steps (under {under}; {first.panel_per_group} panel "
                            f"samples a group at most), median [quartiles], share of the tier's planned ε:", 110),
             f"{'by':<10} {'group':<24} {'n':>5} {'ε median':>9} {'[q1, q3]':>17} {'share':>6}"]
    for grouping, s in by.items():
        for g in s.groups:
            lines.append(f"{grouping[:10]:<10} {g.group[:24]:<24} {g.n_samples:>5} {g.epsilon_median:>9.3f} "
                         f"{f'[{g.epsilon_q1:.3f}, {g.epsilon_q3:.3f}]':>17} {g.share_median:>6.1%}")
    lines.extend(textwrap.wrap(first.note, 110))
    return "\n".join(lines)


def no_dp_note(summary) -> str:
    """'' for a run with a formal DP guarantee, else "  [no formal DP guarantee: <why>]" (ε spent is null);
    ``summary``: a RunSummary or its stored dict."""
    s = RunSummary.of(summary)
    if s.formal_dp:
        return ""
    return f"  [no formal DP guarantee: {s.formal_dp_reason or 'see the run plan'}]"
