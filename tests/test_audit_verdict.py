"""The Δ verdict in words (engine.audit.pa_alooa.verdict.delta_verdict) on constructed reports: resolved or not against
the null Δ, the ranking by Δ, disjoint vs overlapping CIs, a paired comparison used when the report has one,
and no "-0.00"."""
from __future__ import annotations

from engine.audit.pa_alooa.records import Estimate, PairedComparison
from engine.audit.pa_alooa.report import AlgorithmReport, AuditReport
from engine.audit.pa_alooa.summary import compact_summary, summary_table
from engine.audit.pa_alooa.verdict import delta_verdict, dpsgd_s_verdict, verdict_lines


def _algo(key, label, delta, null=(0.2, 1.4), resolved=None, name=None):
    """An algorithm with Δ = (value, low, high) in pp and a null Δ spread; ``resolved`` as the analysis sets it
    (Δ's CI low above the null Δ's high) unless given."""
    value, low, high = delta
    if resolved is None and null is not None:
        resolved = low > null[1]
    d = {"key": key, "name": name or key, "label": label, "formal_dp": key != "nonprivate",
         "gpr": {"groups": {"a": {"mean": 0.1, "low": 0.09, "high": 0.11}},
                 "delta": {"value": value, "low": low, "high": high}},
         "null": {"delta": None if null is None else {"value": sum(null) / 2, "low": null[0], "high": null[1]}},
         "resolved": resolved, "accuracy": {"mean": 0.9}}
    return AlgorithmReport.from_dict(d)


def _report(*algos, comparisons=()):
    return AuditReport(dataset="digits", n_train=100, R=2, n_models=4, threshold="held_out", group_by="class",
                       group_names=("a",), group_sizes={"a": 100}, tier_names=("all",), tier_sizes=(100,),
                       algorithms=tuple(algos), comparisons=tuple(comparisons))


NP = ("nonprivate", "Non-private SGD")
DP = ("dpsgd", "DP-SGD")


def test_disjoint_cis_are_resolved_and_ranked_highest_first():
    r = _report(_algo(*DP, (8.9, 8.2, 9.6)), _algo(*NP, (12.5, 11.3, 14.0)))  # the audit's order: DP-SGD first
    lines = delta_verdict(r)
    assert lines[0] == ("Δ resolved: Non-private SGD 12.50 pp [11.30, 14.00] > DP-SGD 8.90 [8.20, 9.60]; "
                        "the difference is beyond both CIs.")
    assert lines[1] == ("DP-SGD: Δ 8.90 pp [8.20, 9.60], resolved: its CI lies above the null Δ [0.20, 1.40] "
                        "(shuffled membership).")
    assert lines[2].startswith("Non-private SGD: Δ 12.50 pp [11.30, 14.00], resolved")
    assert verdict_lines(r) == lines  # no DP-SGD-S: the Δ verdict is the whole answer
    assert "Verdict: " + " ".join(lines) in summary_table(r)  # the CLI table prints the same words


def test_overlapping_cis_are_not_resolved_and_an_unresolved_delta_says_its_ci_reaches_the_null():
    r = _report(_algo(*NP, (3.1, 1.0, 5.2)), _algo(*DP, (2.9, 0.8, 4.9), null=(0.5, 1.2)))
    first, _, dp = delta_verdict(r)
    assert first == ("Δ not resolved: Non-private SGD 3.10 pp [1.00, 5.20] ≥ DP-SGD 2.90 [0.80, 4.90]; "
                     "the CIs overlap.")
    assert dp == ("DP-SGD: Δ 2.90 pp [0.80, 4.90], not resolved: its CI reaches the null Δ [0.50, 1.20] "
                  "(shuffled membership).")


def test_three_algorithms_say_which_adjacent_pair_is_resolved():
    r = _report(_algo("dpsgd_s", "DP-SGD-S", (8.1, 7.0, 9.0), name="dpsgd_s"), _algo(*NP, (12.5, 11.3, 14.0)),
                _algo(*DP, (8.9, 8.2, 9.6)))
    first = delta_verdict(r)[0]
    assert first.startswith("Δ partly resolved: Non-private SGD 12.50 pp [11.30, 14.00] > DP-SGD 8.90 [8.20, 9.60] "
                            "≥ DP-SGD-S 8.10 [7.00, 9.00]; ")
    assert first.endswith("Non-private SGD vs DP-SGD: the difference is beyond both CIs; "
                          "DP-SGD vs DP-SGD-S: the CIs overlap.")


def test_a_paired_comparison_decides_when_the_report_has_one():
    # the two CIs overlap, but the paired difference (same splits and draws) excludes 0
    s, d = _algo("dpsgd_s", "DP-SGD-S", (8.1, 7.0, 9.0), name="dpsgd_s"), _algo(*DP, (8.9, 8.2, 9.6))
    c = PairedComparison(a="dpsgd_s", b="dpsgd", a_label="DP-SGD-S", b_label="DP-SGD", delta=Estimate(-0.8, -1.1, -0.5),
                         delta_unpaired=Estimate(-0.8, -2.1, 0.6), groups={}, reference_gpr={},
                         accuracy=Estimate(-1.0, -2.0, 0.0), n_boot=100, ci=0.95)
    first = delta_verdict(_report(s, d, comparisons=[c]))[0]
    assert first == ("Δ resolved: DP-SGD 8.90 pp [8.20, 9.60] > DP-SGD-S 8.10 [7.00, 9.00]; "
                     "the paired difference 0.80 pp [0.50, 1.10] excludes 0.")
    c2 = PairedComparison(**{**c.__dict__, "delta": Estimate(-0.8, -1.9, 0.3)})
    assert delta_verdict(_report(s, d, comparisons=[c2]))[0].endswith(
        "the paired difference 0.80 pp [-0.30, 1.90] covers 0: not resolved.")
    # verdict_lines: the Δ verdict first, then DP-SGD-S's own sentences
    lines = verdict_lines(_report(s, d, comparisons=[c]))
    assert lines[:3] == delta_verdict(_report(s, d, comparisons=[c]))
    assert lines[3].startswith("DP-SGD-S lowers Δ by 0.80 pp [0.50, 1.10] vs DP-SGD")


def test_one_algorithm_no_ci_no_null_and_no_negative_zero():
    only = delta_verdict(_report(_algo(*DP, (-0.001, -0.004, 0.6), null=None)))
    assert only == ["DP-SGD: Δ 0.00 pp [0.00, 0.60], no null Δ to resolve it against."]
    assert "-0.00" not in " ".join(only)
    r = _report(_algo(*NP, (2.0, None, None), null=None), _algo(*DP, (1.0, None, None), null=None))
    assert delta_verdict(r)[0] == "Δ not resolved: Non-private SGD 2.00 pp [—, —] ≥ DP-SGD 1.00 [—, —]; no CI to tell them apart."
    assert delta_verdict(r)[1] == "Non-private SGD: Δ 2.00 pp (no CI), no null Δ to resolve it against."
    assert delta_verdict(_report()) == []


def test_the_json_summary_carries_the_verdict_with_or_without_paired_comparisons():
    lone = _report(_algo(*NP, (12.5, 11.3, 14.0)), _algo(*DP, (8.9, 8.2, 9.6)))
    out = compact_summary(lone)
    assert "comparisons" not in out and out["verdict"] == verdict_lines(lone)
    assert out["verdict"][0].startswith("Δ resolved: Non-private SGD 12.50 pp [11.30, 14.00] > DP-SGD 8.90")


def _with_accuracy(acc: Estimate) -> AuditReport:
    """DP-SGD-S against DP-SGD, its accuracy difference (DP-SGD-S − DP-SGD, points) ``acc``."""
    s, d = _algo("dpsgd_s", "DP-SGD-S", (8.1, 7.0, 9.0), name="dpsgd_s"), _algo(*DP, (8.9, 8.2, 9.6))
    c = PairedComparison(a="dpsgd_s", b="dpsgd", a_label="DP-SGD-S", b_label="DP-SGD", delta=Estimate(-0.8, -1.1, -0.5),
                         delta_unpaired=Estimate(-0.8, -2.1, 0.6), groups={}, reference_gpr={}, accuracy=acc,
                         n_boot=100, ci=0.95)
    return _report(s, d, comparisons=[c])


def _accuracy_line(acc: Estimate) -> str:
    (line,) = [x for x in dpsgd_s_verdict(_with_accuracy(acc), "dpsgd_s") if "accuracy is" in x]
    return line


def test_the_accuracy_sentence_says_whether_dpsgd_s_is_less_or_more_accurate():
    """Issue 58: "Accuracy cost of DP-SGD-S: +0.07 points" read as a loss either way; the sentence says below or
    above, with the CI of the gap when it is resolved, else the signed difference with its CI."""
    assert _accuracy_line(Estimate(0.07, -0.10, 0.24)) == (
        "DP-SGD-S's accuracy is 0.07 points above DP-SGD's (DP-SGD-S − DP-SGD +0.07 points [-0.10, +0.24]: "
        "not resolved).")
    below, above = _accuracy_line(Estimate(-0.52, -0.73, -0.31)), _accuracy_line(Estimate(0.40, 0.10, 0.70))
    assert below == "DP-SGD-S's accuracy is 0.52 points below DP-SGD's [0.31, 0.73]."
    assert above == "DP-SGD-S's accuracy is 0.40 points above DP-SGD's [0.10, 0.70]."
    assert _accuracy_line(Estimate(-1.0, None, None)) == "DP-SGD-S's accuracy is 1.00 points below DP-SGD's (no CI)."
    assert _accuracy_line(Estimate(0.0, -0.2, 0.2)).startswith("DP-SGD-S's accuracy is equal to DP-SGD's (")
    assert _accuracy_line(Estimate(-0.004, -0.2, 0.2)).startswith("DP-SGD-S's accuracy is within 0.01 points of "
                                                                  "DP-SGD's (DP-SGD-S − DP-SGD -0.00 points")
    assert not any("cost" in x for x in verdict_lines(_with_accuracy(Estimate(0.07, -0.10, 0.24))))
