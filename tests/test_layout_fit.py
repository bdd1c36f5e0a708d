"""Texts that fit their figure (issue 58, point 7), seen by the engine without a browser: the ε-spent chart of 3+ runs
stacks one panel per run, each titled on one line of at most PANEL_TITLE_CHARS (a run's DP note's head in the title,
its reason in the notes below, every note line whole words of at most NOTE_CHARS); the chart says why RDP's curve
jumps early (issue 58, point 8c), only for runs under RDP; the one-run audit figure's subtitle is whole words in
lines of at most SUBTITLE_CHARS. tests/test_browser_layout.py measures the same figures in Chromium."""
from __future__ import annotations

import html

from hypothesis import given
from hypothesis import strategies as st

from engine.figures import curves, frames, scaffold, training
from engine.figures.one_run import SUBTITLE_CHARS, claimed_vs_empirical
from engine.jobs.runs import dp_note, run_label
from test_one_run_figures import make_report
from test_plots import make_run

REASON = "DP-SGD-S with a non-private quantile (the exact batch quantile of gradient norms)"


def three_runs(n: int = 3, *, accountant: str | None = None) -> list[dict]:
    """``n`` runs of one comparison: IDP-SGD, a DP-SGD-S without a formal guarantee (its reason recorded), INO-SGD
    named at length, and DP-SGD for the rest; ``accountant``: recorded in every run's plan."""
    runs = [make_run(1, "idp_sample"), make_run(2, "dpsgd_s", private_quantile=False),
            make_run(3, "ino") | {"name": "INO-SGD with the paper's Beta(1.5, 1.5) ramp over a long tail <γ = 0.4>"}]
    runs += [make_run(k + 1, "dpsgd") for k in range(3, n)]
    runs[1]["plan"]["formal_dp_reason"] = REASON
    for r in runs:
        if accountant is not None:
            r["plan"]["accountant"] = accountant
    return runs


def epsilon_figure(runs):
    (spec,) = training.build_figures(runs, names=["epsilon_spent"])
    return spec.figure


def panel_titles(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.name != "epsilon_notes"]


def notes_text(fig) -> str:
    return "".join(a.text for a in fig.layout.annotations if a.name == "epsilon_notes")


def test_the_epsilon_chart_stacks_one_titled_panel_per_run_on_one_line_each():
    for n in (3, 4):
        runs = three_runs(n)
        fig = epsilon_figure(runs)
        titles = panel_titles(fig)
        assert len(titles) == n
        assert all(len(html.unescape(t)) <= curves.PANEL_TITLE_CHARS and "<br>" not in t for t in titles), titles
        assert titles[0] == run_label(runs[0]) and titles[1] == f"{run_label(runs[1])} — no formal DP guarantee"
        assert titles[2].startswith("INO-SGD with the paper") and titles[2].endswith("…")  # a long name, cut
        # one column: every panel spans the same x domain, the panels' y domains are disjoint and stacked
        xs = {tuple(fig.layout[scaffold.axis_name("x", p)].domain) for p in range(n)}
        ys = sorted(tuple(fig.layout[scaffold.axis_name("y", p)].domain) for p in range(n))
        assert len(xs) == 1 and all(a[1] < b[0] for a, b in zip(ys, ys[1:])), (xs, ys)
        assert fig.layout.legend.x > 1  # beside the plot, never over a panel title
        # the DP note's reason is said below the plot, whole, in lines of whole words
        lines = notes_text(fig).split("<br>")
        assert all(len(html.unescape(line)) <= curves.NOTE_CHARS for line in lines), lines
        assert REASON in html.unescape(" ".join(lines))


def test_the_epsilon_chart_says_why_rdp_jumps_early_only_under_rdp():
    rdp = notes_text(epsilon_figure(three_runs(accountant="rdp"))).replace("<br>", " ")
    assert html.escape(curves.RDP_EARLY_NOTE, quote=False) in rdp
    assert "log(1/δ)/(α − 1)" in curves.RDP_EARLY_NOTE and "upper bound" in curves.RDP_EARLY_NOTE
    older = notes_text(epsilon_figure(three_runs())).replace("<br>", " ")  # plans stored before they named it: RDP
    assert "RDP: its conversion" in older
    pld = notes_text(epsilon_figure(three_runs(accountant="pld"))).replace("<br>", " ")
    assert "RDP" not in pld
    # the figure builder without accountants says nothing about one
    hist = frames.tier_history(three_runs())
    plain = training.fig_epsilon_spent(hist, notes={run_label(r): dp_note(r) for r in three_runs()})
    assert "RDP" not in notes_text(plain)


def test_the_one_run_subtitle_is_whole_words_in_lines_that_fit():
    for kw in ({}, {"kind": "both"}):
        report = make_report(broken=True, partial=True)
        fig = claimed_vs_empirical(report, **kw)
        lines = fig.layout.title.subtitle.text.split("<br>")
        assert len(lines) >= 3 and all(len(html.unescape(line)) <= SUBTITLE_CHARS for line in lines), lines
        joined = html.unescape(" ".join(lines))
        assert "line: the claimed ε (bar and ◆ ≤ line: consistent)" in joined  # the sentence that was cut, whole
        assert report.broken_line(["white"]) in joined
        assert fig.layout.margin.t >= 80 + 18 * len(lines)  # room for every line


@given(st.text(alphabet="ab <&>%{ ", max_size=80), st.integers(8, 60))
def test_fit_line_keeps_a_prefix_within_the_width_and_never_cuts_an_entity(raw, width):
    text = scaffold.esc(raw)
    out = scaffold.fit_line(text, width)
    assert len(out) <= width
    if len(text) <= width:
        assert out == text
    else:
        body = out.removesuffix("…")
        assert out.endswith("…") and text.startswith(body)
        assert body.count("&") == body.count(";")  # every entity whole
