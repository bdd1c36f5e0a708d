"""The audit's answer in words: every audit's Δ per algorithm — resolved or not against its null Δ, and the
algorithms ranked by Δ — then what DP-SGD-S's group-specific clipping does to Δ, against DP-SGD and against
the controls that say what its extra noise alone would do (``AuditConfig.controls``), with paired CIs.

    delta_verdict(report)      "Δ resolved: Non-private SGD 12.50 pp [11.30, 14.00] > DP-SGD 8.90 [8.20, 9.60];
                               the difference is beyond both CIs." then one sentence per algorithm: its Δ and CI
                               (bias-corrected, with the plug-in max − min GPR it came from: stats.DELTA_METHOD)
                               against its null Δ ("… not resolved: its CI reaches the null Δ [0.20, 1.40]")
    difference(e, what)        "lowers Δ by 1.9 pp [0.8, 3.0]" / "raises …" / "changes … (not resolved)"
    dpsgd_s_verdict(report, k) the sentences for the DP-SGD-S algorithm ``k``: Δ vs DP-SGD and vs the
                               noise-matched control (beyond / not beyond what its extra noise explains), vs the
                               accuracy-matched control, its accuracy against DP-SGD's ("0.52 points below
                               DP-SGD's") and its noise, and "levelling up" per group
    verdict_lines(report)      delta_verdict, then every DP-SGD-S algorithm's sentences (the page, the CLI table,
                               docs/RESULTS.md)

A difference is resolved when its paired CI excludes 0: "lowers" when the whole CI is below 0 (a − b < 0),
"raises" when above, "not resolved" otherwise. Levelling up (the seed paper's claim) holds against a
reference when every high-risk group (GPR under the reference at or above the groups' mean) has its risk
lowered and no group has it raised; it fails when some group's risk is raised; else it is not resolved.

Two algorithms' Δ are told apart when their paired comparison's CI excludes 0 (the report has one for DP-SGD-S
and its references: same splits, same draws) or, without one, when their two CIs are disjoint — a
conservative test, since disjoint CIs imply a resolved difference but overlapping ones do not imply the
opposite; the sentence says which test it used.
"""
from __future__ import annotations

from engine.audit.pa_alooa.records import Estimate, PairedComparison
from engine.audit.pa_alooa.report import AuditReport
from engine.audit.pa_alooa.stats import DELTA_METHOD_SHORT
from engine.dp.algorithms import find_algorithm


def _n(x, spec=".2f") -> str:
    return "—" if x is None else format(x, spec)


def resolved_sign(e: Estimate) -> int | None:
    """−1: the CI is below 0; +1: above; 0: it covers 0; None: no CI."""
    if e is None or e.low is None or e.high is None:
        return None
    return -1 if e.high < 0 else (1 if e.low > 0 else 0)


def difference(e: Estimate, what: str = "Δ", unit: str = "pp") -> str:
    """A paired difference a − b in words, magnitudes positive: "lowers Δ by 1.9 pp [0.8, 3.0]"."""
    sign = resolved_sign(e)
    if sign is None:
        return f"changes {what} by {_n(e.value, '+.2f') if e is not None else '—'} {unit} (no CI)"
    if sign < 0:
        return f"lowers {what} by {-e.value:.2f} {unit} [{-e.high:.2f}, {-e.low:.2f}]"
    if sign > 0:
        return f"raises {what} by {e.value:.2f} {unit} [{e.low:.2f}, {e.high:.2f}]"
    return f"changes {what} by {e.value:+.2f} {unit} [{e.low:+.2f}, {e.high:+.2f}] (not resolved)"


def levelling_up(c: PairedComparison) -> str:
    """Whether ``c.a`` lowered the high-risk groups' risk (under ``c.b``) without raising the others'."""
    ref = {g: v for g, v in c.reference_gpr.items() if v is not None and g in c.groups}
    if len(ref) < 2:
        return f"levelling up vs {c.b_label}: needs two groups with a GPR"
    mean = sum(ref.values()) / len(ref)
    high = [g for g, v in ref.items() if v >= mean]
    low = [g for g in ref if g not in high]
    signs = {g: resolved_sign(c.groups[g]) for g in ref}
    cells = ", ".join(f"{'high' if g in high else 'low'}-risk {g} {_n(c.groups[g].value, '+.2f')} pp "
                      f"[{_n(c.groups[g].low, '+.2f')}, {_n(c.groups[g].high, '+.2f')}]" for g in ref)
    if any(s == 1 for s in signs.values()):
        raised = [g for g, s in signs.items() if s == 1]
        word = f"does not hold: risk raised for {', '.join(raised)}"
    elif all(signs[g] == -1 for g in high) and all(signs[g] is not None for g in low):
        word = "holds: risk lowered for the high-risk group" + ("s" if len(high) > 1 else "") + \
               (" without raising it for the others" if low else "")
    else:
        word = "not resolved"
    return f"Levelling up vs {c.b_label} {word} (GPR differences, paired: {cells})."


def dpsgd_s_verdict(report: AuditReport, key: str) -> list[str]:
    """The sentences for DP-SGD-S algorithm ``key`` of ``report`` (empty without a DP-SGD comparison)."""
    s = report.algorithm(key)
    controls = report.controls_of(key)
    vs = {c.b: c for c in report.comparisons if c.a == key}
    base = report.dpsgd_comparison(key)
    noise = controls.get("noise_matched")
    acc = controls.get("accuracy_matched")
    lines = []
    if base is not None:
        head = f"{s.label} {difference(base.delta)} vs {base.b_label}"
        if noise is not None and noise.key in vs:
            c = vs[noise.key]
            sign = resolved_sign(c.delta)
            why = {-1: "beyond what its extra noise explains", 1: "less than its extra noise alone would",
                   0: "not beyond what its extra noise explains", None: "no CI"}[sign]
            head += (f", and {difference(c.delta)} vs noise-matched DP-SGD (σ {noise.control.noise_multiplier:.3g}, "
                     f"ε {noise.control.epsilon:.3g} < {noise.control.target_epsilon:g}): {why}")
        lines.append(head + ".")
    if acc is not None and acc.key in vs:
        c, info = vs[acc.key], acc.control
        matched = "" if info.matched else " (no crossing in the searched range: the nearest end)"
        lines.append(f"At equal accuracy — DP-SGD at ε {info.epsilon:.3g}{matched}: {_acc(acc)} vs {s.label} "
                     f"{_acc(s)} — {s.label} {difference(c.delta)}.")
    if base is not None:
        ratio = s.noise_ratio
        lines.append(accuracy_versus(base)
                     + (f", with {ratio:.2f}× DP-SGD's noise at the same ε (z_Δ · mean max_k C_k / (σ · C))"
                        if ratio is not None else "") + ".")
        lines.append(levelling_up(base))
        if noise is not None and noise.key in vs:
            lines.append(levelling_up(vs[noise.key]))
    return lines


def accuracy_versus(c: PairedComparison) -> str:
    """``c.a``'s test accuracy against ``c.b``'s in words, the direction said (a signed "cost" read both ways):
    "DP-SGD-S's accuracy is 0.52 points below DP-SGD's [0.31, 0.73]" — the paired CI of the gap when it excludes
    0 — else the signed difference a − b with its CI, "(not resolved)"."""
    e, who, ref = c.accuracy, f"{c.a_label}'s accuracy", f"{c.b_label}'s"
    if e is None or e.value is None:
        return f"{who} against {ref}: not measured"
    if round(abs(e.value), 2) == 0:  # "0.00 points below" would name a direction the number does not show
        gap = f"equal to {ref}" if e.value == 0 else f"within 0.01 points of {ref}"
    else:
        gap = f"{abs(e.value):.2f} points {'below' if e.value < 0 else 'above'} {ref}"
    sign = resolved_sign(e)
    if sign is None:
        return f"{who} is {gap} (no CI)"
    if sign < 0:
        return f"{who} is {gap} [{-e.high:.2f}, {-e.low:.2f}]"
    if sign > 0:
        return f"{who} is {gap} [{e.low:.2f}, {e.high:.2f}]"
    return (f"{who} is {gap} ({c.a_label} − {c.b_label} {e.value:+.2f} points [{e.low:+.2f}, {e.high:+.2f}]: "
            f"not resolved)")


def _acc(a) -> str:
    e = a.accuracy_ci or Estimate(None if a.accuracy.mean is None else 100 * a.accuracy.mean, None, None)
    return f"{_n(e.value, '.2f')} % [{_n(e.low, '.2f')}, {_n(e.high, '.2f')}]"


def _pp(x) -> str:
    """A Δ in pp, two decimals, never "-0.00" (a rounded tiny negative reads as a sign that is not there)."""
    if x is None:
        return "—"
    v = round(float(x), 2)
    return f"{(v if v != 0 else 0.0):.2f}"


def _ci(e: Estimate) -> str:
    return f"[{_pp(e.low)}, {_pp(e.high)}]"


def _pair(hi, lo, report: AuditReport) -> tuple[bool, str]:
    """Whether ``hi``'s Δ is resolved above ``lo``'s, and the words for how that was decided."""
    c = report.comparison(hi.key, lo.key)
    sign = 1
    if c is None:
        c, sign = report.comparison(lo.key, hi.key), -1
    if c is not None and c.delta.low is not None and c.delta.high is not None:
        d = Estimate(sign * c.delta.value, *sorted((sign * c.delta.low, sign * c.delta.high)))
        ok = resolved_sign(d) == 1  # the paired CI wholly above 0
        return ok, (f"the paired difference {_pp(d.value)} pp {_ci(d)} "
                    + ("excludes 0" if ok else "covers 0: not resolved"))
    if None in (hi.delta.low, hi.delta.high, lo.delta.low, lo.delta.high):
        return False, "no CI to tell them apart"
    ok = hi.delta.low > lo.delta.high
    return ok, "the difference is beyond both CIs" if ok else "the CIs overlap"


def _ranking(report: AuditReport, algos: list) -> str:
    ranked = sorted(algos, key=lambda a: -a.delta.value)  # stable: ties keep the audit's order
    pairs = [_pair(hi, lo, report) for hi, lo in zip(ranked, ranked[1:])]
    n_ok = sum(ok for ok, _ in pairs)
    head = "Δ resolved" if n_ok == len(pairs) else ("Δ not resolved" if n_ok == 0 else "Δ partly resolved")
    text = f"{ranked[0].label} {_pp(ranked[0].delta.value)} pp {_ci(ranked[0].delta)}"
    for (ok, _), a in zip(pairs, ranked[1:]):
        text += f" {'>' if ok else '≥'} {a.label} {_pp(a.delta.value)} {_ci(a.delta)}"
    if len(pairs) == 1:
        why = pairs[0][1]
    else:
        why = "; ".join(f"{hi.label} vs {lo.label}: {w}" for (_, w), hi, lo in zip(pairs, ranked, ranked[1:]))
    return f"{head}: {text}; {why}."


def _against_null(a) -> str:
    d, nd = a.delta, a.null_delta
    head = f"{a.label}: Δ {_pp(d.value)} pp" + (f" {_ci(d)}" if d.low is not None and d.high is not None
                                                 else " (no CI)")
    if a.delta_plug_in is not None:  # a report of version 3 on: say what Δ is and where it came from
        head += f" (max − min GPR {_pp(a.delta_plug_in)} pp, {DELTA_METHOD_SHORT})"
    if a.resolved is None or nd is None:
        return head + ", no null Δ to resolve it against."
    null = f"the null Δ {_ci(nd)} (shuffled membership)"
    return head + (f", resolved: its CI lies above {null}." if a.resolved
                   else f", not resolved: its CI reaches {null}.")


def delta_verdict(report: AuditReport) -> list[str]:
    """Every audit's Δ in words: the algorithms ranked by Δ (adjacent pairs told apart or not), then each
    algorithm's Δ against its null Δ. One algorithm: only its own sentence; none with a Δ: []."""
    algos = [a for a in report.algorithms if a.delta.value is not None]
    out = [_ranking(report, algos)] if len(algos) > 1 else []
    return out + [_against_null(a) for a in algos]


def verdict_lines(report: AuditReport) -> list[str]:
    """The Δ verdict (every audit), then every DP-SGD-S algorithm's sentences (an algorithm with controls,
    engine.dp.algorithms), in the audit's order."""
    out = delta_verdict(report)
    for a in report.algorithms:
        entry = find_algorithm(a.name)
        if entry is not None and entry.controls is not None and a.control is None:
            out += dpsgd_s_verdict(report, a.key)
    return out
