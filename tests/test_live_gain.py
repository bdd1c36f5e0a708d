"""The Train page's headline (engine/figures/headline.py, the ``private_gain`` figure of engine/figures/training.py):
INO − IDP recall gain on the most private tier over steps, its sentence, its live patching, and algorithm
colours that stay apart under simulated colour blindness and in greyscale."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from engine.figures import frames, headline, training
from engine.figures.live import LiveFigures
from engine.figures.scaffold import ALGORITHM_COLORS
from test_live_figures import assert_same_figure, snapshot
from test_plots import make_run, seed_series


# --- the sentence, on constructed gain frames ------------------------------------------------------------

def gain_frame(steps, ino, idp, *, eps: float = 1.0, total: int | None = None, idp_loss=None) -> pd.DataFrame:
    """A one-tier gain frame (engine.figures.frames.GAIN_TIME_COLUMNS) for pairs j: ino[j], idp[j] the recalls
    at ``steps`` (progress = step / total, total the last step by default); ``idp_loss`` IDP-SGD's tier loss at
    ``steps`` (default :data:`RISEN`: in its MID)."""
    total = total or steps[-1]
    idp_loss = RISEN if idp_loss is None else idp_loss
    rows = []
    for j, (a, b) in enumerate(zip(ino, idp)):
        for s, ra, rb, lb in zip(steps, a, b, idp_loss):
            rows.append({"pair": f"INO #{10 + j} − IDP-SGD (SAMPLE) #{j}", "ino_run_id": 10 + j, "idp_run_id": j,
                         "seed": j, "seed_index": j, "series": "INO − IDP", "step": s, "epoch": s / 100,
                         "elapsed": s / 10, "progress": s / total, "tier": "ε=1", "tier_index": 0, "epsilon": eps,
                         "epsilon_spent": eps * s / total, "ino_recall": ra, "idp_recall": rb, "gain": ra - rb,
                         "idp_loss": lb})
    return pd.DataFrame(rows, columns=frames.GAIN_TIME_COLUMNS)


STEPS = [0, 39, 78, 117]
DIPPING = [0.30, 0.10, 0.12, 0.15]  # IDP-SGD's recall of the tier
RISEN = [2.30, 2.52, 2.47, 2.41]  # IDP-SGD's loss of the tier: above its initial value since step 39, still


def test_ahead_and_in_the_mid():
    g = gain_frame(STEPS, [[0.30, 0.12, 0.14, 0.171]], [DIPPING], total=1406)
    assert headline.gain_sentence(g) == ("INO-SGD ahead by +2.1 recall points on the ε = 1 tier at step 117 "
                                         "(1 seed: no spread); "
                                         "IDP-SGD still in its MID")


def test_behind_level_and_no_negative_zero():
    behind = gain_frame(STEPS, [[0.30, 0.10, 0.12, 0.137]], [DIPPING], total=1406)
    assert headline.gain_sentence(behind).startswith("IDP-SGD ahead by +1.3 recall points on the ε = 1 tier at step 117")
    for delta in (0.004, -0.004, -0.0004, 0.005):
        level = gain_frame(STEPS, [[0.30, 0.10, 0.12, 0.15 + delta]], [DIPPING], total=1406)
        text = headline.gain_sentence(level)
        assert text.startswith("INO-SGD and IDP-SGD level (within ±0.5 recall points) on the ε = 1 tier at step 117")
        assert "−0.0" not in text and "-0.0" not in text and "+0.0" not in text
    assert headline.gain_sentence(pd.DataFrame(columns=frames.GAIN_TIME_COLUMNS)) is None


def test_mid_recovered_none_and_undecided():
    ino, idp = [[0.30, 0.2, 0.3, 0.4]], [[0.30, 0.10, 0.29, 0.35]]
    recovered = gain_frame(STEPS, ino, idp, total=1406, idp_loss=[2.30, 2.5, 2.30, 2.1])  # back at its start
    assert headline.gain_sentence(recovered).endswith("; IDP-SGD out of its MID since step 78")
    falling = [2.30, 2.2, 2.1, 2.0]
    rising = gain_frame(STEPS, ino, idp, total=1406, idp_loss=falling)
    assert "MID" not in headline.gain_sentence(rising)  # running, no rise yet: its MID may be ahead
    done = gain_frame(STEPS, ino, idp, idp_loss=falling)  # progress 1 at the last step
    assert headline.gain_sentence(done).endswith("; IDP-SGD had no MID")
    early = gain_frame(STEPS[:1], [[0.30]], [[0.30]], total=1406)  # the initial evaluation only: undecided
    assert "MID" not in headline.gain_sentence(early)
    assert headline.mid_state([0, 1, 2, 3], [2.3, 2.5, 2.4, 2.4], finished=False) == ("ongoing", 1)
    assert headline.mid_state([0, 1, 2, 3], [2.3, 2.5, 2.4, 2.4], finished=True) == ("ongoing", 1)  # ended in it
    assert headline.mid_state([0, 1, 2], [2.3, 2.3, 2.2], finished=True) == ("none", None)  # level is not above
    assert headline.mid_state([0, 1, 2], [2.3, float("nan"), 2.2]) == (None, None)


@pytest.mark.parametrize("count", [2, 3, 5, 8, 11])
def test_the_sentence_and_the_mid_chart_read_one_rule(count):
    """The sentence's MID of IDP-SGD is the MID the chart shades and the MID table lists (frames.mid_spans) for
    the same run and tier, at every stage of a run whose ε = 1 tier rises above its initial loss and comes back."""
    runs = snapshot([make_run(1, "idp_sample", status="running"), make_run(2, "ino", gain=0.2, status="running")],
                    [count, count])
    spans = frames.mid_spans(runs)
    text = headline.gain_sentence(headline.private_gain(runs))
    expected = ""
    for run_id, who in ((1, "IDP-SGD"), (2, "INO-SGD")):  # each algorithm's MID, IDP-SGD's first
        span = spans[(spans.run_id == run_id) & (spans.tier == "ε=1")].iloc[0]
        expected += f"; {who} still in its MID" if span.state == "ongoing" else \
            f"; {who} out of its MID since step {span.end_step:.0f}"
    assert text.endswith(expected), (spans, text)
    assert {2: "ongoing", 11: "recovered"}.get(count, span.state) == span.state  # both states are met


def test_the_sentence_names_ino_sgds_mid_too():
    g = gain_frame(STEPS, [[0.30, 0.12, 0.14, 0.171]], [DIPPING], total=1406)
    g["ino_loss"] = g["step"].map(dict(zip(STEPS, [2.30, 2.4, 2.25, 2.1])))  # INO-SGD back below its start at 78
    assert headline.gain_sentence(g) == ("INO-SGD ahead by +2.1 recall points on the ε = 1 tier at step 117 "
                                         "(1 seed: no spread); "
                                         "IDP-SGD still in its MID; INO-SGD out of its MID since step 78")
    g["ino_loss"] = 2.30  # never above its start, and INO-SGD's run over: it had none
    done = g.assign(progress=g["step"] / 117)
    assert headline.gain_sentence(done).endswith("; IDP-SGD still in its MID; INO-SGD had no MID")


def test_seeds_give_a_spread_only_when_several():
    ino = [[0.30, 0.12, 0.14, 0.17], [0.30, 0.12, 0.14, 0.19], [0.30, 0.12, 0.14, 0.18]]
    three = headline.gain_sentence(gain_frame(STEPS, ino, [DIPPING] * 3, total=1406))
    assert three == ("INO-SGD ahead by +3.0 ± 0.6 recall points on the ε = 1 tier at step 117 (mean of 3 paired "
                     "seeds); IDP-SGD still in its MID")
    one = headline.gain_sentence(gain_frame(STEPS, ino[:1], [DIPPING], total=1406))
    assert "±" not in one.split("level")[0] and "paired seeds" not in one
    # a pair behind the others: the latest step every pair has reached
    lagging = pd.concat([gain_frame(STEPS, ino[:2], [DIPPING] * 2, total=1406),
                         gain_frame(STEPS[:3], ino[2:], [DIPPING], total=1406).assign(ino_run_id=12)])
    assert "at step 78 (mean of 3 paired seeds)" in headline.gain_sentence(lagging)


# --- the figure ---------------------------------------------------------------------------------------------

def pair_runs(k: int) -> list[dict]:
    """k seeds of IDP-SGD (SAMPLE) and INO-SGD (its ε=1 tier's recall 0.1 more), plus a DP-SGD run, running."""
    if k == 1:
        runs = [make_run(1, "idp_sample", group="gs"), make_run(2, "ino", group="gs", gain=0.1)]
    else:
        runs = seed_series(1, "idp_sample", k, offsets=[0.01 * j for j in range(k)]) + \
            seed_series(1 + k, "ino", k, offsets=[0.01 * j for j in range(k)], gains=[0.1 + 0.02 * j for j in range(k)])
    runs.append(make_run(9, "dpsgd", group="gs"))
    for r in runs:
        r["status"] = "running"
    return runs


def plotted(spec) -> dict:
    """The figure's traces by role: lines, bands (the filled upper edge), the legend-only marks."""
    lines = [t for t in spec.figure.data if (t.meta or "").startswith("line|")]
    bands = [t for t in spec.figure.data if t.fill == "tonexty"]
    return {"lines": lines, "bands": bands}


@pytest.mark.parametrize("k", [1, 3])
def test_the_gain_figure_reads_back(k):
    runs = pair_runs(k)
    runs = snapshot(runs, [6] * len(runs))  # half way: INO's lead (which fades by the end here) still shows
    assert training.live_figure_names(runs)[0] == "private_gain"
    (spec,) = training.build_figures(runs, names=["private_gain"])
    got = plotted(spec)
    assert len(got["lines"]) == 1 and "ε=1" in got["lines"][0].name  # the most private tier only
    assert set(spec.data["tier"]) == {"ε=1"}
    curve = headline.gain_curve(spec.data)
    # the mean paired gain per step, in recall points: the unit of the sentence above the chart
    assert np.allclose(np.asarray(got["lines"][0].y, float), 100 * curve["gain"])
    assert spec.figure.layout.yaxis.title.text == "recall gain, INO − IDP (pp)"
    assert list(got["lines"][0].x) == list(curve["step"])
    assert (len(got["bands"]) == 1) == (k > 1)  # a band over the seeds only with several
    assert [(s.type, s.y0, s.y1) for s in spec.figure.layout.shapes] == [("line", 0, 0)]  # the zero line
    assert "ε = 1" in spec.figure.layout.title.text
    assert headline.gain_sentence(spec.data).startswith("INO-SGD ahead by")
    (by_epoch,) = training.build_figures(runs, names=["private_gain"], x_axis="epoch")
    assert list(plotted(by_epoch)["lines"][0].x) == pytest.approx(list(spec.data.groupby("step")["epoch"].mean()))


def test_no_pair_no_gain_figure():
    runs = [make_run(1, "idp_sample"), make_run(3, "dpsgd")]
    assert training.live_figure_names(runs) == training.LIVE_FIGURES + training.INDIVIDUAL_LIVE_FIGURES
    opted_out = [{**r, "config": {**(r.get("config") or {}), "individual_epsilon": False}} for r in runs]
    assert training.live_figure_names(opted_out) == training.LIVE_FIGURES
    (spec,) = training.build_figures(runs, names=["private_gain"])
    assert spec.data.empty and headline.gain_sentence(spec.data) is None


@pytest.mark.slow
def test_the_live_gain_figure_is_patched_and_equals_a_fresh_build():
    runs = pair_runs(2)
    names = ["private_gain", "mid_curves", "tier_recall"]
    live = LiveFigures(names)
    first = live.update(snapshot(runs, [3] * len(runs)))
    for n in range(4, 12):
        specs = live.update(snapshot(runs, [n] * len(runs)))
        assert specs["private_gain"].figure is first["private_gain"].figure  # kept and patched, not rebuilt
        (fresh,) = training.build_figures(snapshot(runs, [n] * len(runs)), names=["private_gain"])
        assert_same_figure(specs["private_gain"].figure, fresh.figure, f"private_gain at {n}")
        assert specs["private_gain"].data.equals(fresh.data)
    assert live.builds == len(names) and live.patches == 8 * len(names)


# --- algorithm colours under colour-vision deficiency and in greyscale -------------------------------------

# Machado, Oliveira & Fernandes (2009), severity 1.0, on linear RGB
MACHADO = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}
SRGB_TO_XYZ = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
WHITE = np.array([0.95047, 1.0, 1.08883])  # D65
THE_SIX = ("idp_sample", "idp_scale", "ino", "dpsgd", "dpsgd_s", "nonprivate")
MIN_DELTA_E = 15.0  # CIEDE2000 between every two of the six, in each vision (≥ 10 is "clearly different")
MIN_CONTROL_DELTA_E = 10.0  # the audits' two DP-SGD controls, from each other and from the six
MIN_GREY_L = 20.0  # CIELAB L* between INO-SGD and the IDP-SGD it builds on


def linear_rgb(hex_color: str) -> np.ndarray:
    c = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]) / 255.0
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def lab(rgb: np.ndarray) -> np.ndarray:
    xyz = SRGB_TO_XYZ @ np.clip(rgb, 0.0, 1.0) / WHITE
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def ciede2000(lab1, lab2) -> float:
    """ΔE00 (Sharma, Wu & Dalal 2005)."""
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    cbar = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(cbar ** 7 / (cbar ** 7 + 25 ** 7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = math.hypot(a1p, b1), math.hypot(a2p, b2)
    h1p = math.degrees(math.atan2(b1, a1p)) % 360 if c1p else 0.0
    h2p = math.degrees(math.atan2(b2, a2p)) % 360 if c2p else 0.0
    dlp, dcp = l2 - l1, c2p - c1p
    dh = h2p - h1p
    if c1p * c2p == 0:
        dh = 0.0
    elif dh > 180:
        dh -= 360
    elif dh < -180:
        dh += 360
    dhp = 2 * math.sqrt(c1p * c2p) * math.sin(math.radians(dh / 2))
    lbar, cbarp = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        hbar = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        hbar = (h1p + h2p) / 2
    else:
        hbar = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (1 - 0.17 * math.cos(math.radians(hbar - 30)) + 0.24 * math.cos(math.radians(2 * hbar))
         + 0.32 * math.cos(math.radians(3 * hbar + 6)) - 0.20 * math.cos(math.radians(4 * hbar - 63)))
    dtheta = 30 * math.exp(-(((hbar - 275) / 25) ** 2))
    rc = 2 * math.sqrt(cbarp ** 7 / (cbarp ** 7 + 25 ** 7))
    sl = 1 + 0.015 * (lbar - 50) ** 2 / math.sqrt(20 + (lbar - 50) ** 2)
    sc, sh = 1 + 0.045 * cbarp, 1 + 0.015 * cbarp * t
    rt = -math.sin(math.radians(2 * dtheta)) * rc
    return math.sqrt((dlp / sl) ** 2 + (dcp / sc) ** 2 + (dhp / sh) ** 2 + rt * (dcp / sc) * (dhp / sh))


def seen(hex_color: str, vision: str) -> np.ndarray:
    rgb = linear_rgb(hex_color)
    return lab(rgb if vision == "normal" else np.array(MACHADO[vision]) @ rgb)


def test_ciede2000_matches_sharmas_reference_pairs():
    for a, b, want in [((50, 2.6772, -79.7751), (50, 0, -82.7485), 2.0425),
                       ((50, 0, 0), (50, -1, 2), 2.3669),
                       ((50, 2.5, 0), (73, 25, -18), 27.1492),
                       ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644)]:
        assert ciede2000(a, b) == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("vision", ["normal", "protanopia", "deuteranopia", "tritanopia"])
def test_algorithm_colours_stay_apart_under_colour_blindness(vision):
    for a, b in itertools.combinations(THE_SIX, 2):
        d = ciede2000(seen(ALGORITHM_COLORS[a], vision), seen(ALGORITHM_COLORS[b], vision))
        assert d >= MIN_DELTA_E, f"{a} vs {b} under {vision}: ΔE00 {d:.1f} < {MIN_DELTA_E}"
    controls = [k for k in ALGORITHM_COLORS if k not in THE_SIX]
    for a in controls:
        for b in [k for k in ALGORITHM_COLORS if k != a]:
            d = ciede2000(seen(ALGORITHM_COLORS[a], vision), seen(ALGORITHM_COLORS[b], vision))
            assert d >= MIN_CONTROL_DELTA_E, f"{a} vs {b} under {vision}: ΔE00 {d:.1f}"


def test_ino_and_idp_apart_in_greyscale():
    for idp in ("idp_sample", "idp_scale"):
        grey = abs(seen(ALGORITHM_COLORS["ino"], "normal")[0] - seen(ALGORITHM_COLORS[idp], "normal")[0])
        assert grey >= MIN_GREY_L, f"INO-SGD vs {idp} in greyscale: ΔL* {grey:.1f} < {MIN_GREY_L}"


def test_a_tier_that_barely_trains_is_said_and_a_healthy_plan_says_nothing():
    """A 2-epoch IDP-SGD (SAMPLE) comparison on the MNIST paper tiers: the ε = 1 tier's q = 0.00086 draws each of
    its samples 0.2 times over 234 steps, so its recall (and the gain on it) stays at its start: the lab says so."""
    short = {"steps": 234, "tier_names": ["ε=1", "ε=2", "ε=3"], "target_epsilons": [1.0, 2.0, 3.0],
             "sample_rates": [0.00086, 0.0077, 0.0146], "mode": "sample"}
    runs = [{"id": 1, "plan": short}, {"id": 2, "plan": {**short, "sample_rates": [0.0009, 0.0077, 0.0146]}}]
    assert headline.undersampled_note(runs) == (
        "The ε=1 tier barely trains: sampled at q = 0.00086, each of its samples is drawn 0.2 times on average over "
        "234 steps (the other tiers' 1.8–3.4), so its recall stays near its start and a gain there of about 0 pp "
        "says nothing; train more epochs to see it move.")
    long = {**short, "steps": 1406, "sample_rates": [0.0033, 0.0084, 0.0124]}  # 12 epochs: 4.6 draws each
    assert headline.undersampled_note([{"id": 1, "plan": long}]) is None
    dpsgd = {**short, "sample_rates": [0.001, 0.001, 0.001], "mode": "dpsgd"}  # one rate: a short run, not a tier
    assert headline.undersampled_note([{"id": 1, "plan": dpsgd}, {"id": 2, "plan": None}]) is None
