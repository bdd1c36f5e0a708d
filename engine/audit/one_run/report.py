"""The one-run audit's result, typed: per algorithm and tier the claimed ε next to the empirical lower bounds ε̂
(white-box gradient canaries, black-box input canaries), each read two ways from the same guesses (``BOUNDS``:
Steinke et al.'s bound and the f-DP bound, each at confidence 1 − β). ``OneRunReport.from_dict(r.to_dict()) == r``;
:meth:`OneRunReport.frame` is the one tidy frame the figure, the tables and the exports read, and the report owns
its verdict in words (:func:`row_verdict`, :meth:`OneRunReport.verdict_sentences`,
:meth:`OneRunReport.broken_line`): the page, the figure and the CLI say what it computes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from engine.audit.one_run.bound import OneRunBound

KINDS = {"white": "white-box (gradient canaries)", "black": "black-box (input canaries)"}
# The two analyses of the same canary guesses (engine.audit.one_run.bound, engine.audit.one_run.fdp), each a sound
# lower bound at confidence 1 − β. A claim is called broken when either exceeds it, so a false alarm has
# probability at most 2β; a row says which bound exceeded.
BOUNDS = {"steinke": "Steinke et al. 2023", "fdp": "f-DP (Mahloujifar et al. 2025)"}
BOUND_WORDS = {"steinke": "Steinke", "fdp": "f-DP"}
NO_FORMAL_DP = "no formal DP"  # an algorithm without a formal guarantee: ε̂ is shown without a claim
NO_CLAIM = f"{NO_FORMAL_DP} (ε̂ shown without a claim)"


def row_verdict(exceeds_claim: bool, formal_dp: bool) -> str:
    """One row's verdict (algorithm × tier × kind): ε̂ within the claim, above it (BROKEN), or no claim at all."""
    if exceeds_claim:
        return "BROKEN: ε̂ exceeds the claim"
    return "ε̂ ≤ ε" if formal_dp else f"{NO_FORMAL_DP} (no claim)"


def _kind_word(kind: str) -> str:
    return KINDS[kind].split(" ")[0]  # "white-box"


def _bound(d):
    return None if d is None else OneRunBound.from_dict(d)


@dataclass(frozen=True)
class TierBound:
    """One tier of one run: its claimed ε (None without a formal guarantee) and each kind's ε̂ (None: not run),
    by Steinke et al.'s bound (``white``, ``black``) and by the f-DP bound (``white_fdp``, ``black_fdp``; None in
    reports stored before it)."""

    tier: str
    epsilon: float | None
    white: OneRunBound | None = None
    black: OneRunBound | None = None
    white_fdp: OneRunBound | None = None
    black_fdp: OneRunBound | None = None

    def bound(self, kind: str, method: str = "steinke") -> OneRunBound | None:
        return getattr(self, kind if method == "steinke" else f"{kind}_{method}")

    def to_dict(self) -> dict:
        out = {"tier": self.tier, "epsilon": self.epsilon}
        for name in ("white", "black", "white_fdp", "black_fdp"):
            b = getattr(self, name)
            out[name] = None if b is None else b.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "TierBound":
        eps = d.get("epsilon")
        return cls(tier=str(d["tier"]), epsilon=None if eps is None else float(eps), white=_bound(d.get("white")),
                   black=_bound(d.get("black")), white_fdp=_bound(d.get("white_fdp")),
                   black_fdp=_bound(d.get("black_fdp")))


@dataclass(frozen=True)
class AlgorithmOneRun:
    """One algorithm's run with the canaries."""

    key: str
    algorithm: str
    label: str
    formal_dp: bool
    formal_dp_reason: str | None
    tiers: tuple[TierBound, ...]
    accuracy: float  # on the test examples not used as canaries
    steps: int
    seconds: float

    def to_dict(self) -> dict:
        return {"key": self.key, "algorithm": self.algorithm, "label": self.label, "formal_dp": self.formal_dp,
                "formal_dp_reason": self.formal_dp_reason, "tiers": [t.to_dict() for t in self.tiers],
                "accuracy": self.accuracy, "steps": self.steps, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict) -> "AlgorithmOneRun":
        return cls(key=str(d["key"]), algorithm=str(d["algorithm"]), label=str(d["label"]),
                   formal_dp=bool(d["formal_dp"]), formal_dp_reason=d.get("formal_dp_reason"),
                   tiers=tuple(TierBound.from_dict(t) for t in d["tiers"]), accuracy=float(d["accuracy"]),
                   steps=int(d["steps"]), seconds=float(d["seconds"]))


@dataclass(frozen=True)
class OneRunReport:
    dataset: str
    delta: float
    beta: float
    canaries: int  # white-box canaries per tier
    input_canaries: int  # black-box canaries per tier (as used: capped by half the test set)
    algorithms: tuple[AlgorithmOneRun, ...] = ()
    partial: bool = False  # True while the audit is still running (the algorithms so far)
    notes: tuple[str, ...] = field(default=())

    kind = "one_run"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "dataset": self.dataset, "delta": self.delta, "beta": self.beta,
                "canaries": self.canaries, "input_canaries": self.input_canaries,
                "algorithms": [a.to_dict() for a in self.algorithms], "partial": self.partial,
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: dict) -> "OneRunReport":
        return cls(dataset=str(d["dataset"]), delta=float(d["delta"]), beta=float(d["beta"]),
                   canaries=int(d["canaries"]), input_canaries=int(d["input_canaries"]),
                   algorithms=tuple(AlgorithmOneRun.from_dict(a) for a in d.get("algorithms", [])),
                   partial=bool(d.get("partial", False)), notes=tuple(d.get("notes", [])))

    def frame(self) -> pd.DataFrame:
        """One row per algorithm × tier × canary kind: claimed ε, ε̂ by each bound (confidence 1 − β each; the
        f-DP one NaN in reports stored before it) and the larger of them (``epsilon_hat_max``, what the claim is held
        against), ε̂/ε, whether either ε̂ exceeds the claim (a broken implementation; ``exceeded_by`` names the
        bounds), and the guesses behind Steinke's ε̂."""
        rows = []
        for a in self.algorithms:
            for t in a.tiers:
                for kind in KINDS:
                    b, f = t.bound(kind), t.bound(kind, "fdp")
                    if b is None:
                        continue
                    hats = {"steinke": b.epsilon_hat, "fdp": None if f is None else f.epsilon_hat}
                    top = max(e for e in hats.values() if e is not None)  # what the claim is held against
                    over = [m for m, e in hats.items() if e is not None and t.epsilon is not None and e > t.epsilon]
                    rows.append({"algorithm": a.key, "label": a.label, "tier": t.tier, "kind": kind,
                                 "kind_label": KINDS[kind], "epsilon": t.epsilon, "epsilon_hat": b.epsilon_hat,
                                 "ratio": b.epsilon_hat / t.epsilon if t.epsilon else None,
                                 "epsilon_hat_fdp": hats["fdp"],
                                 "ratio_fdp": hats["fdp"] / t.epsilon if t.epsilon and f is not None else None,
                                 "epsilon_hat_max": top,
                                 "exceeds_claim": bool(over), "exceeded_by": " and ".join(BOUND_WORDS[m] for m in over),
                                 "formal_dp": a.formal_dp, "verdict": row_verdict(bool(over), a.formal_dp),
                                 "canaries": b.m, "guesses": b.guesses, "correct": b.correct,
                                 "confidence": b.confidence, "accuracy": a.accuracy})
        frame = pd.DataFrame(rows, columns=["algorithm", "label", "tier", "kind", "kind_label", "epsilon",
                                            "epsilon_hat", "ratio", "epsilon_hat_fdp", "ratio_fdp", "epsilon_hat_max",
                                            "exceeds_claim", "exceeded_by", "formal_dp", "verdict", "canaries",
                                            "guesses", "correct", "confidence", "accuracy"])
        return frame.astype({"epsilon_hat_fdp": float, "ratio_fdp": float, "epsilon_hat_max": float})

    def violations(self) -> pd.DataFrame:
        """The rows whose ε̂ exceeds the claimed ε: with probability ≥ 1 − β the implementation breaks its claim."""
        f = self.frame()
        return f[f["exceeds_claim"].astype(bool)]

    def broken_line(self, kinds=None) -> str | None:
        """The violations in one line (None: there are none), of the canary ``kinds`` given (default: all)."""
        bad = self.violations()
        if kinds is not None:
            bad = bad[bad["kind"].isin(list(kinds))]
        if bad.empty:
            return None
        return "BROKEN — ε̂ exceeds the claimed ε: " + "; ".join(
            f"{r.label} {r.tier} ({r.kind}, {r.exceeded_by}: {r.epsilon_hat_max:.2f} > {r.epsilon:.2f})"
            for r in bad.itertuples())

    def verdict_sentences(self) -> list[str]:
        """One sentence per algorithm: every tier below its claim, the tiers whose ε̂ exceed it (BROKEN), or no
        formal DP (its largest ε̂, without a claim)."""
        f = self.frame()
        out = []
        for a in self.algorithms:
            d = f[f["algorithm"] == a.key]
            if d.empty:
                continue
            if not a.formal_dp:
                top = d.loc[d["epsilon_hat_max"].idxmax()]
                out.append(f"{a.label}: {NO_CLAIM} — its largest ε̂ is {top.epsilon_hat_max:.2f} (tier {top.tier}, "
                           f"{_kind_word(top.kind)}).")
                continue
            bad = d[d["exceeds_claim"].astype(bool)]
            if bad.empty:
                kinds = " and ".join(_kind_word(k) for k in dict.fromkeys(d["kind"]))
                fdp = d["ratio_fdp"].max()
                out.append(f"{a.label}: every tier's ε̂ stays below its claimed ε ({kinds}; largest "
                           f"ε̂/ε = {d['ratio'].max():.2f}" + (f", f-DP {fdp:.2f}" if pd.notna(fdp) else "") + ").")
            else:
                out.append(f"{a.label} — BROKEN: " + "; ".join(
                    f"tier {r.tier}'s ε̂ {r.epsilon_hat_max:.2f} ({_kind_word(r.kind)}, {r.exceeded_by}) exceeds its "
                    f"claimed {r.epsilon:.2f}" for r in bad.itertuples()) + ".")
        return out


def _hat(b: OneRunBound | None) -> str:
    return "–" if b is None else f"{b.epsilon_hat:.3f}"


def one_run_table(summary: dict) -> str:
    """The stored summary as text (``python -m engine show``, the CLI)."""
    report = OneRunReport.from_dict(summary)
    f = report.frame()
    conf = f"{100 * (1 - report.beta):g} %"
    lines = [f"one-run audit on {report.dataset}: ε̂ = empirical ε lower bound at {conf} confidence (δ = "
             f"{report.delta:g}); {report.canaries} gradient and {report.input_canaries} input canaries per tier"]
    if f.empty:
        return lines[0] + "\n(no algorithm finished yet)"
    lines.append(f"{'':<22} {'':<10} {'':>9} {'ε̂ white-box':>17} {'ε̂ black-box':>17}")
    lines.append(f"{'algorithm':<22} {'tier':<10} {'claimed ε':>9} {'Steinke':>8} {'f-DP':>8} {'Steinke':>8} "
                 f"{'f-DP':>8}  accuracy")
    for a in report.algorithms:
        for t in a.tiers:
            claimed = "no DP" if t.epsilon is None else f"{t.epsilon:.3g}"
            hats = " ".join(f"{_hat(t.bound(kind, method)):>8}" for kind in KINDS for method in BOUNDS)
            lines.append(f"{a.label[:22]:<22} {t.tier[:10]:<10} {claimed:>9} {hats}  {a.accuracy:.3f}")
    broken = report.broken_line()
    if broken:
        lines.append(broken)
    lines.extend(report.notes)
    return "\n".join(lines)
