"""An audit report as text: the headline numbers (``--json``) and the table (``python -m engine audit`` / ``show``),
with the verdict sentences (``engine.audit.pa_alooa.verdict``) under the table."""
from __future__ import annotations

from engine.audit.pa_alooa.records import Estimate
from engine.audit.pa_alooa.report import AlgorithmReport, as_report
from engine.audit.pa_alooa.verdict import verdict_lines


def compact_summary(results) -> dict:
    """The headline numbers of an audit (what ``--json`` prints); ``results``: a report or its dict."""
    r = as_report(results)
    out = {"dataset": r.dataset, "n_train": r.n_train, "R": r.R, "n_models": r.n_models, "threshold": r.threshold,
           "group_by": r.group_by, "score": r.score, "seconds": r.seconds, "train_seconds": r.train_seconds,
           "stats_seconds": r.stats_seconds}
    out["algorithms"] = [{
        "key": a.key, "label": a.label, "formal_dp": a.formal_dp, "accuracy": a.accuracy.mean,
        "gpr": {g: e.value for g, e in a.gpr.items()}, "gpr_ci": {g: [e.low, e.high] for g, e in a.gpr.items()},
        "delta_pp": a.delta.value, "delta_ci": [a.delta.low, a.delta.high], "delta_plug_in_pp": a.delta_plug_in,
        "delta_method": r.delta_method, "null_floor": a.null_floor,
        "null_floor_groups": dict(a.null_groups),
        "null_delta": None if a.null_delta is None else [a.null_delta.low, a.null_delta.high],
        "resolved": a.resolved, "pa_ga": a.baselines.pa_ga, "lira_auc": {g: v.auc for g, v in a.lira.items()},
        "epsilon": [{"tier": t.name, "claimed": c, "lower_bound": t.lower_bound}
                    for t, c in zip(a.epsilon, a.claimed_epsilons())],
        **({"noise_ratio": a.noise_ratio} if a.noise_ratio is not None else {}),
        **({"control": a.control.to_dict()} if a.control is not None else {}),
    } for a in r.algorithms]
    if r.comparisons:
        out["comparisons"] = [{"a": c.a, "b": c.b, "delta_diff_pp": c.delta.value, "delta_diff_ci": [c.delta.low, c.delta.high],
                               "delta_diff_ci_unpaired": [c.delta_unpaired.low, c.delta_unpaired.high],
                               "accuracy_diff": c.accuracy.value, "accuracy_diff_ci": [c.accuracy.low, c.accuracy.high],
                               "gpr_diff_pp": {g: e.value for g, e in c.groups.items()},
                               "gpr_diff_ci": {g: [e.low, e.high] for g, e in c.groups.items()}}
                              for c in r.comparisons]
    out["verdict"] = verdict_lines(r)  # every audit has its Δ verdict; paired comparisons add to it
    return out


# beyond this many groups the GPR cells leave the algorithms' rows for a table of their own (10 digit classes
# inline made a table ~240 characters wide; issue 60)
MAX_INLINE_GROUPS = 4


def summary_table(results) -> str:
    """The audit as a text table (``python -m engine audit`` / ``show``); ``results``: a report or its dict."""
    r = as_report(results)
    groups = r.group_names
    lines = [f"PA-ALOOA on {r.dataset} (n={r.n_train}, 2R={r.n_models} models per algorithm, threshold "
             f"{r.threshold}, score {r.score or 'loss (float32)'}, groups by {r.group_by})"
             + ("  [partial]" if r.partial else "")]
    inline = groups if len(groups) <= MAX_INLINE_GROUPS else []  # more groups: their own table below
    lines.append(f"{'algorithm':<22} {'acc':>6} " + "".join(f"{('GPR ' + g)[:14]:>14} " for g in inline)
                 + f"{'Δ pp [CI]':>20} {'null Δ':>13} {'resolved':>8} {'ε LB / claimed':>18}")
    for a in r.algorithms:
        d, nd = a.delta, a.null_delta
        eps = ", ".join(f"{_f(t.lower_bound, '.2f')}/{_f(c, '.2f')}" for t, c in zip(a.epsilon, a.claimed_epsilons()))
        lines.append(f"{a.label[:22]:<22} {_f(a.accuracy.mean, '.3f'):>6} "
                     + "".join(f"{_gpr_cell(a, g):>14} " for g in inline)
                     + f"{_f(d.value, '.2f')} [{_f(d.low, '.2f')}, {_f(d.high, '.2f')}]".rjust(20)
                     + f" {_spread(nd):>13}"
                     + f" {_yes_no(a.resolved):>8} {eps:>18}")
    if not inline:  # one row per group, one column per algorithm: as wide as the algorithms, not the groups
        lines.append(f"{'GPR by group':<22} " + " ".join(f"{a.label[:15]:>15}" for a in r.algorithms))
        for g in groups:
            lines.append(f"{g[:22]:<22} " + " ".join(f"{_gpr_cell(a, g):>15}" for a in r.algorithms))
    lines.append("GPR cells: the group's GPR / its own null floor (permuted membership); claimed ε — : no formal "
                 "guarantee; resolved: Δ's CI above the null Δ spread")
    lines.append(r.delta_method + ".")
    for a in r.algorithms:
        if a.control is not None:
            c = a.control
            lines.append(f"{a.label}: σ {c.noise_multiplier:.4g}, ε {c.epsilon:.4g} (target {c.target_epsilon:g})"
                         + (f"; DP-SGD-S realised σ {c.realised_noise_multiplier:.4g}" if c.kind == "noise_matched"
                            else f"; DP-SGD-S pilot accuracy {100 * c.target_accuracy:.2f} %, "
                                 f"{len(c.search)} ε tried on {c.pilot_models} models"
                                 + ("" if c.matched else ", no crossing found")))
    if r.comparisons:
        lines.append("Paired comparisons (a − b; same splits and initialisations; paired bootstrap CI, the unpaired "
                     "one in parentheses):")
        for c in r.comparisons:
            gprs = ", ".join(f"{g} {_f(e.value, '+.2f')} [{_f(e.low, '+.2f')}, {_f(e.high, '+.2f')}]"
                             for g, e in c.groups.items())
            lines.append(f"  {c.a_label} − {c.b_label}: Δ {_f(c.delta.value, '+.2f')} pp "
                         f"[{_f(c.delta.low, '+.2f')}, {_f(c.delta.high, '+.2f')}] "
                         f"({_f(c.delta_unpaired.low, '+.2f')}, {_f(c.delta_unpaired.high, '+.2f')}); accuracy "
                         f"{_f(c.accuracy.value, '+.2f')} points [{_f(c.accuracy.low, '+.2f')}, "
                         f"{_f(c.accuracy.high, '+.2f')}]; GPR pp: {gprs}")
    verdict = verdict_lines(r)
    if verdict:
        lines.append("Verdict: " + " ".join(verdict))
    if r.seconds is not None:
        lines.append(f"{r.seconds:.1f} s ({_f(r.train_seconds, '.1f')} s training, "
                     f"{_f(r.stats_seconds, '.1f')} s statistics)")
    return "\n".join(lines)


def _f(x, spec):
    return "—" if x is None else format(x, spec)


def _gpr_cell(a: AlgorithmReport, g: str) -> str:
    gpr = _f(a.gpr[g].value if g in a.gpr else None, ".4f")
    floor = a.null_groups.get(g, a.null_floor if not a.null_groups else None)
    return f"{gpr}/{_f(floor, '.3f')}"


def _spread(e: Estimate | None) -> str:
    return "—" if e is None else f"[{_f(e.low, '.2f')}, {_f(e.high, '.2f')}]"


def _yes_no(x) -> str:
    return "—" if x is None else ("yes" if x else "NO")
