"""The one-run audit's figure (engine.figures.one_run): built from a report put together by hand, its bars sit
side by side per algorithm, the claimed ε is drawn on each bar at its value, a bar whose ε̂ exceeds its claim is
outlined and annotated, non-formal algorithms are labelled, and the figure exports like the others."""
from __future__ import annotations

import numpy as np
import pytest

from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.one_run.bound import OneRunBound
from engine.audit.one_run.config import OneRunConfig
from engine.audit.one_run.report import AlgorithmOneRun, OneRunReport, TierBound
from engine.figures import export
from engine.figures.audit import AUDIT_FIGURES
from engine.figures.one_run import (BROKEN_COLOR, NO_FORMAL_DP, ONE_RUN_FIGURES, bar_positions, build_one_run_figures,
                                    claimed_vs_empirical)
from engine.store.db import RunStore
from test_plots import hostile_audit

TIERS = ("ε=1", "ε=2", "ε=3")
needs_chromium = pytest.mark.skipif(not export.static_export_available()[0],
                                    reason=export.static_export_available()[1] or "no static export")


def bound(eps_hat: float, m: int = 500) -> OneRunBound:
    return OneRunBound(epsilon_hat=eps_hat, m=m, guesses=50, correct=41, k_plus=25, k_minus=25, beta=0.05,
                       delta=1e-5, grid_size=12)


FDP_GAIN = 0.05  # the hand-built f-DP ε̂ sits this much above Steinke's (as it does at the lab's m and δ)


def algorithm(key, name, label, claimed, white, black=None, formal=True, tiers=TIERS, fdp=True) -> AlgorithmOneRun:
    black = black or [None] * len(white)

    def both(w, m):
        if w is None:
            return {}
        return {"": bound(w, m), "_fdp": bound(round(w + FDP_GAIN, 3), m) if fdp else None}

    def tier(t, e, w, b):
        fields = {f"white{s}": v for s, v in both(w, 500).items()}
        fields.update({f"black{s}": v for s, v in both(b, 60).items()})
        return TierBound(t, e, **fields)

    return AlgorithmOneRun(key=key, algorithm=name, label=label, formal_dp=formal,
                           formal_dp_reason=None if formal else "no noise",
                           tiers=tuple(tier(t, e, w, b) for t, e, w, b in zip(tiers, claimed, white, black)),
                           accuracy=0.9, steps=112, seconds=3.0)


def make_report(*, broken: bool = True, black: bool = True, partial: bool = False, tiers=TIERS) -> OneRunReport:
    """DP-SGD (every tier at ε = 1), IDP-SGD SAMPLE (ε 1/2/3; tier ε=2 broken when ``broken``) and non-private
    SGD (no claim)."""
    algos = (
        algorithm("dpsgd", "dpsgd", "DP-SGD", [1.0, 1.0, 1.0], [0.3, 0.35, 0.32],
                  [0.1, 0.12, 0.11] if black else None, tiers=tiers),
        algorithm("idp_sample", "idp_sample", "IDP-SGD (SAMPLE)", [1.0, 2.0, 3.0], [0.4, 2.6 if broken else 0.9, 1.2],
                  [0.13, 0.87, 0.4] if black else None, tiers=tiers),
        algorithm("nonprivate", "nonprivate", "Non-private SGD", [None, None, None], [3.5, 3.4, 3.6],
                  [1.17, 1.13, 1.2] if black else None, formal=False, tiers=tiers),
    )
    return OneRunReport(dataset="digits", delta=1e-5, beta=0.05, canaries=500, input_canaries=60, algorithms=algos,
                        partial=partial)


def bars(fig, kind="white"):
    return {t.meta["algorithm"]: t for t in fig.data if t.type == "bar" and t.meta["kind"] == kind}


def claimed_segments(fig, kind="white") -> list[tuple[float, float, float]]:
    """(left, centre, right, y) of each claimed-ε segment."""
    (trace,) = [t for t in fig.data if t.type == "scatter" and (t.meta or {}).get("claimed") and t.meta["kind"] == kind]
    x, y = list(trace.x), list(trace.y)
    return [(x[i], x[i + 1], x[i + 2], y[i]) for i in range(0, len(x), 4)]


def test_bars_sit_side_by_side_per_algorithm_at_their_tiers():
    fig = claimed_vs_empirical(make_report())
    b = bars(fig)
    assert list(b) == ["dpsgd", "idp_sample", "nonprivate"]
    xs = np.array([list(t.x) for t in b.values()])  # [algorithm, tier]
    widths = {t.width for t in b.values()}
    assert len(widths) == 1
    (width,) = widths
    for j in range(len(TIERS)):
        col = xs[:, j]
        assert len(set(col)) == 3 and list(col) == sorted(col)  # distinct offsets, in the algorithms' order
        assert np.all(np.abs(col - j) < 0.5)  # inside the tier's slot
        assert np.allclose(np.diff(col), width)  # touching, not overlapping
    assert np.allclose(xs, bar_positions(3, 3)[0])
    assert list(fig.layout.xaxis.ticktext) == list(TIERS) and list(fig.layout.xaxis.tickvals) == [0, 1, 2]
    assert [list(t.y) for t in b.values()] == [[0.3, 0.35, 0.32], [0.4, 2.6, 1.2], [3.5, 3.4, 3.6]]
    assert len({t.marker.color for t in b.values()}) == 3  # each algorithm its own colour


def test_claimed_eps_is_a_segment_on_each_formal_bar_at_its_value():
    report = make_report()
    fig = claimed_vs_empirical(report)
    b = bars(fig)
    segments = claimed_segments(fig)
    want = {(round(x, 9), e) for a in ("dpsgd", "idp_sample")
            for x, e in zip(b[a].x, [t.epsilon for t in next(al for al in report.algorithms if al.key == a).tiers])}
    assert {(round(c, 9), y) for _, c, _, y in segments} == want
    for left, centre, right, _ in segments:
        assert left < centre < right and right - left <= b["dpsgd"].width  # within its bar
    nonprivate = {round(x, 9) for x in b["nonprivate"].x}
    assert not nonprivate & {round(c, 9) for _, c, _, _ in segments}  # no claim drawn for it


def test_a_bar_above_its_claim_is_outlined_and_annotated():
    fig = claimed_vs_empirical(make_report(broken=True))
    b = bars(fig)
    colors, widths = list(b["idp_sample"].marker.line.color), list(b["idp_sample"].marker.line.width)
    assert colors[1] == BROKEN_COLOR and widths[1] > max(widths[0], widths[2])
    assert BROKEN_COLOR not in list(b["dpsgd"].marker.line.color)
    (note,) = [a for a in fig.layout.annotations if "exceeds claim" in a.text]
    assert note.x == pytest.approx(b["idp_sample"].x[1]) and note.y == pytest.approx(2.6 + FDP_GAIN)
    assert "2.65 > 2.00" in note.text and note.showarrow  # the larger of the two bounds
    sub = fig.layout.title.subtitle.text
    assert "BROKEN" in sub and "IDP-SGD (SAMPLE) ε=2" in sub
    assert fig.layout.yaxis.range[1] > 3.6  # room above the tallest bar for the annotation

    ok = claimed_vs_empirical(make_report(broken=False))
    assert not [a for a in ok.layout.annotations if "exceeds claim" in (a.text or "")]
    assert "BROKEN" not in ok.layout.title.subtitle.text
    assert all(c != BROKEN_COLOR for t in bars(ok).values() for c in t.marker.line.color)


def test_non_formal_bars_are_labelled_and_the_subtitle_gives_confidence_and_canaries():
    fig = claimed_vs_empirical(make_report(broken=False))
    b = bars(fig)
    assert NO_FORMAL_DP in b["nonprivate"].name and b["nonprivate"].marker.pattern.shape == "/"
    assert all(NO_FORMAL_DP in t for t in b["nonprivate"].text)
    assert not any(NO_FORMAL_DP in t for t in b["dpsgd"].text)
    sub = fig.layout.title.subtitle.text
    assert "95 % confidence" in sub and "500 gradient canaries" in sub and "per tier" in sub
    assert "input canaries" not in sub  # white-box only
    assert fig.layout.title.text.startswith("Claimed vs empirical ε per tier")
    assert fig.layout.margin.t >= 80 + 18 * 2  # room for the title and every subtitle line
    both = claimed_vs_empirical(make_report(), kind="both")
    assert "60 input canaries" in both.layout.title.subtitle.text


def test_kind_selects_the_canaries_and_both_gives_one_row_per_kind():
    report = make_report()
    black = claimed_vs_empirical(report, kind="black")
    assert list(bars(black, "black")["idp_sample"].y) == [0.13, 0.87, 0.4] and not bars(black, "white")
    both = claimed_vs_empirical(report, kind="both")
    assert {t.yaxis for t in both.data if t.type == "bar"} == {"y", "y2"}
    assert [a.text for a in both.layout.annotations if "box" in a.text] == ["white-box (gradient canaries)",
                                                                            "black-box (input canaries)"]
    white_only = claimed_vs_empirical(make_report(black=False), kind="both")
    assert {t.yaxis for t in white_only.data if t.type == "bar"} == {None} and "yaxis2" not in white_only.to_dict()["layout"]
    none = claimed_vs_empirical(make_report(black=False), kind="black")
    assert not none.data and "no black-box" in none.layout.annotations[0].text
    with pytest.raises(ValueError, match="canary kind"):
        claimed_vs_empirical(report, kind="grey")


def test_empty_and_partial_reports_and_escaped_tier_names():
    empty = OneRunReport(dataset="digits", delta=1e-5, beta=0.05, canaries=500, input_canaries=60, partial=True)
    fig = claimed_vs_empirical(empty.to_dict())  # the stored summary works too
    assert not fig.data and "No one-run audit results yet" in fig.layout.annotations[0].text
    partial = claimed_vs_empirical(make_report(partial=True))
    assert "still training" in partial.layout.title.subtitle.text
    odd = claimed_vs_empirical(make_report(tiers=("<b>x</b>", "%{y}", "ε=3")))
    assert list(odd.layout.xaxis.ticktext)[:2] == ["&lt;b&gt;x&lt;/b&gt;", "%&#123;y}"]
    dark = claimed_vs_empirical(make_report(), theme="dark")
    (claimed,) = [t for t in dark.data if t.type == "scatter" and t.meta.get("claimed")]
    assert claimed.line.color != "#1f2430"  # visible on the dark background


def test_build_specs_carry_the_tidy_frame():
    report = make_report()
    (spec,) = build_one_run_figures(report)
    assert spec.name == ONE_RUN_FIGURES[0] and spec.title == "Claimed vs empirical ε per tier"
    assert spec.data.equals(report.frame()) and len(spec.data) == 3 * 3 * 2
    with pytest.raises(ValueError, match="unknown one-run figure"):
        build_one_run_figures(report, names=["nope"])


@pytest.mark.slow
@needs_chromium
def test_the_figure_exports_to_png_and_through_export_runs(tmp_path):
    report = make_report()
    png = export.figure_bytes(claimed_vs_empirical(report), "png", width=800, height=500, scale=1)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    store = RunStore(tmp_path / "runs.sqlite")
    rid = store.create_run(OneRunConfig().to_dict(), kind="one_run", status="queued", name="one-run")
    store.finish_runs({rid: report.to_dict()})
    paths = export.export_runs(store, [rid], formats=["png", "svg", "pdf", "html", "csv"], out_dir=tmp_path / "out")
    names = sorted(p.name for p in paths)
    assert names == sorted(f"runs-{rid}_one_run_epsilon.{f}" for f in ("png", "svg", "pdf", "html", "csv"))
    out = {p.suffix: p.read_bytes() for p in paths}
    assert out[".png"][:4] == b"\x89PNG" and out[".pdf"][:4] == b"%PDF" and b"<svg" in out[".svg"][:500]
    assert b"Claimed vs empirical" in out[".html"]
    assert out[".csv"].decode().splitlines()[0].startswith("algorithm,label,tier,kind")
    assert len(out[".csv"].decode().splitlines()) == 1 + 18
    assert all(p.parent == tmp_path / "out" for p in paths)


def test_export_finds_the_audits_among_run_records():
    """Each audit gives its own kind's figures (the type of its configuration decides), a training run none here."""
    summary = make_report().to_dict()
    one = {"id": 7, "kind": "one_run", "config": OneRunConfig().to_dict(), "summary": summary}
    train = {"id": 8, "kind": "train", "config": OneRunConfig().run.to_dict(), "summary": {"final": {}}}
    pa = {"id": 5, "kind": "audit", "config": AuditConfig().to_dict(), "summary": hostile_audit()}
    assert [s.name for s in export.audit_figures([one, train])] == ["one_run_epsilon"]
    assert [s.name for s in export.audit_figures([one, {**one, "id": 9}, train])] == ["one_run_epsilon_7",
                                                                                     "one_run_epsilon_9"]
    assert [s.name for s in export.audit_figures([pa, train])] == list(AUDIT_FIGURES)
    assert [s.name for s in export.audit_figures([pa, one])] == [f"{n}_5" for n in AUDIT_FIGURES] + ["one_run_epsilon_7"]
    assert export.audit_figures([{**one, "summary": None}, {**pa, "summary": None}]) == []  # queued: nothing yet


def test_the_verdict_words_are_the_reports_and_every_reader_says_them():
    """One owner for the one-run verdict (issue 41): the report computes each row's verdict, the sentences and the
    BROKEN line; the page's table, the figure's subtitle and the CLI's text say exactly those."""
    from engine.audit.one_run.report import one_run_table, row_verdict

    report = make_report(broken=True)
    f = report.frame()
    assert list(f["verdict"]) == [row_verdict(x, d) for x, d in zip(f["exceeds_claim"], f["formal_dp"])]
    assert (f["verdict"] == "BROKEN: ε̂ exceeds the claim").sum() == 1
    line = report.broken_line()
    assert line.startswith("BROKEN") and "IDP-SGD (SAMPLE) ε=2 (white, Steinke and f-DP: 2.65 > 2.00)" in line
    assert line in one_run_table(report.to_dict())
    sub = claimed_vs_empirical(report, kind="white").layout.title.subtitle.text
    assert report.broken_line(["white"]) in sub.replace("&gt;", ">")
    sentences = report.verdict_sentences()
    assert [s.split(":")[0].split(" — ")[0] for s in sentences] == ["DP-SGD", "IDP-SGD (SAMPLE)", "Non-private SGD"]
    assert make_report(broken=False).broken_line() is None


def test_both_bounds_stand_side_by_side_and_either_one_breaks_a_claim():
    """Issue 42: each tier carries ε̂ by Steinke's bound and by the f-DP bound from the same guesses; the frame, the
    CLI table, the figure and the BROKEN line show both, and name which bound exceeded a claim."""
    from engine.audit.one_run.report import one_run_table

    only_fdp = AlgorithmOneRun(key="idp_sample", algorithm="idp_sample", label="IDP-SGD (SAMPLE)", formal_dp=True,
                               formal_dp_reason=None, accuracy=0.9, steps=10, seconds=1.0,
                               tiers=(TierBound("ε=1", 1.0, white=bound(0.97), white_fdp=bound(1.04)),
                                      TierBound("ε=2", 2.0, white=bound(0.5), white_fdp=bound(0.6))))
    report = OneRunReport(dataset="digits", delta=1e-5, beta=0.05, canaries=500, input_canaries=0,
                          algorithms=(only_fdp,))
    assert OneRunReport.from_dict(report.to_dict()) == report
    f = report.frame()
    assert list(f["epsilon_hat_fdp"]) == [1.04, 0.6] and list(f["exceeds_claim"]) == [True, False]
    assert list(f["exceeded_by"]) == ["f-DP", ""]
    assert f["ratio_fdp"].tolist() == pytest.approx([1.04, 0.3])
    assert report.broken_line() == "BROKEN — ε̂ exceeds the claimed ε: IDP-SGD (SAMPLE) ε=1 (white, f-DP: 1.04 > 1.00)"
    text = one_run_table(report.to_dict())
    assert "Steinke" in text and "f-DP" in text
    assert any("0.970" in line and "1.040" in line for line in text.splitlines())
    fig = claimed_vs_empirical(report)
    (diamonds,) = [t for t in fig.data if (t.meta or {}).get("fdp")]
    assert list(diamonds.y) == [1.04, 0.6] and list(diamonds.x) == list(bars(fig)["idp_sample"].x)
    assert any(a.text == "exceeds claim: 1.04 > 1.00" for a in fig.layout.annotations)
    # a report stored before the f-DP bound: NaN there, nothing drawn for it, the verdict from Steinke's alone
    old = {**report.to_dict()}
    old["algorithms"] = [{**a, "tiers": [{k: v for k, v in t.items() if not k.endswith("_fdp")} for t in a["tiers"]]}
                         for a in old["algorithms"]]
    legacy = OneRunReport.from_dict(old)
    assert legacy.frame()["epsilon_hat_fdp"].isna().all() and legacy.broken_line() is None
    assert not [t for t in claimed_vs_empirical(legacy).data if (t.meta or {}).get("fdp")]
