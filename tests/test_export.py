"""Figure export: PNG/SVG/PDF through Kaleido + Chromium, self-contained HTML, CSV, JSON, the
presentation pack, the CLI ``python -m engine export``, and the no-Chromium fallback."""
from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from in_process import cli_here
from PIL import Image
from test_plots import make_run

from engine.figures import export
from engine.figures.training import build_figures
from engine.store.db import RunStore

ROOT = Path(__file__).resolve().parent.parent
needs_chromium = pytest.mark.skipif(not export.static_export_available()[0],
                                    reason="PNG/SVG/PDF export needs Chromium (apt-get install chromium)")


def _store_with_runs(path: Path) -> tuple[RunStore, list[int]]:
    """A run store holding two synthetic finished runs (IDP-SGD and INO-SGD), no training."""
    store = RunStore(path / "runs.sqlite")
    ids = []
    for rec in (make_run(0, "idp_sample"), make_run(0, "ino", gain=0.2)):
        rid = store.create_run(rec["config"], group_id="g-export")
        store.start_run(rid, pid=os.getpid(), total_steps=rec["total_steps"], plan=rec["plan"])
        for e in rec["evals"]:
            store.log_eval(rid, e["step"], e)
        store.finish_run(rid, {"algorithm": rec["algorithm"], "accuracy": 0.9})
        ids.append(rid)
    return store, ids


@pytest.fixture()
def figure():
    return build_figures([make_run(1, "idp_sample"), make_run(2, "ino")], names=["mid_curves"])[0]


@pytest.mark.slow
@needs_chromium
def test_static_formats_are_valid_files(figure):
    png = export.figure_bytes(figure.figure, "png", width=640, height=400, scale=1)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(png)) as im:
        im.load()
        assert im.size == (640, 400)
    svg = export.figure_bytes(figure.figure, "svg", width=640, height=400)
    assert b"<svg" in svg[:2000]
    pdf = export.figure_bytes(figure.figure, "pdf", width=640, height=400)
    assert pdf[:5] == b"%PDF-"
    big = export.figure_bytes(figure.figure, "png", width=640, height=400, scale=2)
    with Image.open(io.BytesIO(big)) as im:
        assert im.size == (1280, 800)


def test_html_is_self_contained(figure):
    html = export.figure_bytes(figure.figure, "html").decode()
    assert html.lstrip().lower().startswith("<html") or "<!doctype html>" in html[:200].lower()
    assert len(html) > 1_000_000  # plotly.js is inlined
    assert "<script src=" not in html  # nothing is fetched from a CDN
    assert "MID curves" in html


def test_csv_and_json_round_trip(figure):
    df = pd.read_csv(io.BytesIO(export.csv_bytes(figure.data)))
    assert {"run", "step", "tier", "loss", "state"} <= set(df.columns) and len(df) == len(figure.data)
    runs = [make_run(1, "idp_sample")]
    configs = json.loads(export.configs_json(runs))
    assert configs[0]["id"] == 1 and configs[0]["config"]["algorithm"]["name"] == "idp_sample"
    metrics = pd.read_csv(io.BytesIO(export.metrics_csv(runs[0])))
    assert set(metrics["scope"]) == {"overall", "tier", "class"}
    assert len(metrics[(metrics.scope == "tier") & (metrics.metric == "recall")]) == 11 * 3


@pytest.mark.slow
def test_without_chromium_static_export_explains_and_html_still_works(monkeypatch, figure, tmp_path):
    monkeypatch.setattr(export, "chromium_path", lambda: None)
    ok, reason = export.static_export_available()
    assert not ok and "Chromium" in reason and "HTML" in reason
    for fmt in ("png", "svg", "pdf"):
        with pytest.raises(export.ExportUnavailable, match="Chromium"):
            export.figure_bytes(figure.figure, fmt)
    assert b"<html" in export.figure_bytes(figure.figure, "html")[:300].lower()
    pack = zipfile.ZipFile(io.BytesIO(export.presentation_pack([make_run(1, "idp_sample")], formats=("png", "html"))))
    names = pack.namelist()
    assert not [n for n in names if n.endswith(".png")] and [n for n in names if n.endswith(".html")]
    assert f"html/{export.PLOTLY_JS}" in names
    assert "Chromium" in pack.read("README.txt").decode()
    store, ids = _store_with_runs(tmp_path)
    with pytest.raises(export.ExportUnavailable):
        export.export_runs(store, ids, formats=["png"], out_dir=tmp_path / "out")
    paths = export.export_runs(store, ids, formats=["html", "csv", "json"], out_dir=tmp_path / "out")
    assert {p.suffix for p in paths} == {".html", ".csv", ".json"}


def train_comparison(store: RunStore, group_id: str = "g-pack") -> list[int]:
    """A real small comparison in ``store``: IDP-SGD and INO-SGD trained on 300 digits for 2 epochs
    through engine.train.loop; returns the run ids."""
    import torch

    from engine.config.run import RunConfig
    from engine.jobs.kinds import execute

    torch.set_num_threads(1)
    ids = []
    for alg in ("idp_sample", "ino"):
        cfg = RunConfig().replace(**{"algorithm.name": alg, "epochs": 2.0, "model.name": "lr",
                                     "data.max_train": 300, "batch_size": 64}).validate()
        rid = store.create_run(cfg, group_id=group_id)
        execute(store, rid, cfg, kind="train")
        ids.append(rid)
    return ids


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """:func:`train_comparison`, read back as run records."""
    from engine.jobs.runs import run_record

    store = RunStore(tmp_path_factory.mktemp("pack") / "runs.sqlite")
    runs = [run_record(store, i) for i in train_comparison(store)]
    assert all(r["status"] == "finished" and r["evals"] for r in runs)
    return runs


def _html_scripts(html: str) -> list[str]:
    import re

    return re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html)


@pytest.mark.slow
def test_presentation_pack_shares_one_plotly_js(trained_runs):
    seen = []
    data = export.presentation_pack(trained_runs, width=1600, height=900, scale=2.0,
                                    progress=lambda done, total, title: seen.append((done, total)))
    assert len(data) <= 5_000_000, f"pack is {len(data) / 1e6:.1f} MB"
    z = zipfile.ZipFile(io.BytesIO(data))
    names = z.namelist()
    specs = export.pack_figures(trained_runs)
    assert len(specs) >= 10  # every figure of a real IDP/INO comparison (all but fairness: no attribute)
    htmls = [n for n in names if n.endswith(".html")]
    assert len(htmls) == len(specs)
    plotly_copies = [n for n in names if n.endswith(".js")]
    assert plotly_copies == [f"html/{export.PLOTLY_JS}"]
    js = z.read(plotly_copies[0]).decode()
    assert len(js) > 1_000_000 and "plotly" in js[:2000].lower()
    for n in htmls:
        html = z.read(n).decode()
        assert _html_scripts(html) == [export.PLOTLY_JS], n  # loads the shared copy beside it, nothing else
        assert len(html) < 500_000  # plotly.js is not inlined
    assert len([n for n in names if n.startswith("data/") and n.endswith(".csv")]) == len(specs)
    configs = json.loads(z.read("configs.json"))
    assert [c["id"] for c in configs] == [r["id"] for r in trained_runs]
    assert configs[1]["config"]["algorithm"]["name"] == "ino"
    mid = pd.read_csv(io.BytesIO(z.read(next(n for n in names if n.startswith("data/") and "mid_summary" in n))))
    assert len(mid) == 2 * 3 and set(mid["tier"]) == {"ε=1", "ε=2", "ε=3"}
    # progress: one call per figure, then the end
    assert seen == [(i, len(specs)) for i in range(len(specs) + 1)]
    if export.static_export_available()[0]:
        for fmt in ("png", "svg"):
            assert len([n for n in names if n.startswith(f"{fmt}/") and n.endswith(f".{fmt}")]) == len(specs)
        with Image.open(io.BytesIO(z.read(next(n for n in names if n.endswith(".png"))))) as im:
            assert im.size == (3200, 1800)
    else:
        assert not [n for n in names if n.endswith((".png", ".svg"))]
        assert "Chromium" in z.read("README.txt").decode()


@pytest.mark.slow
@needs_chromium
def test_presentation_pack_static_images_present(trained_runs):
    z = zipfile.ZipFile(io.BytesIO(export.presentation_pack(trained_runs, names=["mid_curves"], width=800,
                                                            height=450, scale=1.0, formats=("png", "svg"))))
    assert sorted(z.namelist()) == ["README.txt", "configs.json", "png/01_mid_curves.png", "svg/01_mid_curves.svg"]
    with Image.open(io.BytesIO(z.read("png/01_mid_curves.png"))) as im:
        assert im.size == (800, 450)
    assert b"<svg" in z.read("svg/01_mid_curves.svg")[:2000]


@pytest.mark.slow
def test_presentation_pack_holds_the_picked_figures_only(trained_runs):
    picked = ["recall_gain_time", "mid_summary", "tier_recall"]
    z = zipfile.ZipFile(io.BytesIO(export.presentation_pack(trained_runs, names=picked, formats=("html", "csv"))))
    stems = sorted({n.split("/")[1].rsplit(".", 1)[0] for n in z.namelist()
                    if n.startswith(("html/", "data/")) and not n.endswith(".js")})
    assert stems == ["01_recall_gain_time", "02_mid_summary", "03_tier_recall"]
    assert z.namelist().count(f"html/{export.PLOTLY_JS}") == 1


@pytest.mark.slow
def test_mid_summary_slide_fills_the_slide(trained_runs):
    spec = export.pack_figures(trained_runs, names=["mid_summary"])[0]
    small = spec.figure.data[0]
    slide = export.slide_table(spec.figure, width=1600, height=900, rows=len(spec.data))
    table = slide.data[0]
    assert slide.layout.width == 1600 and slide.layout.height == 900
    assert table.cells.font.size >= 2 * small.cells.font.size and table.header.font.size >= 2 * small.header.font.size
    assert table.cells.height * (len(spec.data) + 1) >= 0.5 * 900  # the rows fill at least half the slide
    assert spec.figure.layout.width is None  # the dashboard's figure is left as it was


@pytest.mark.slow
@needs_chromium
def test_cli_export_writes_pngs(tmp_path):
    store, ids = _store_with_runs(tmp_path)
    out = tmp_path / "figs"
    proc = cli_here("export", *ids, "--format", "png", "--format", "json", "--out", out, "--width", "500",
                    "--height", "300", "--scale", "1", store=store.path)
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= 10 and (out / f"runs-{ids[0]}-{ids[1]}_configs.json").exists()
    for p in pngs:
        with Image.open(p) as im:
            im.verify()
    assert {p.name for p in pngs} >= {f"runs-{ids[0]}-{ids[1]}_mid_curves.png",
                                      f"runs-{ids[0]}-{ids[1]}_recall_vs_budget.png"}


def test_export_unknown_run_is_a_config_error(tmp_path):
    store, _ = _store_with_runs(tmp_path)
    proc = cli_here("export", "999", "--format", "html", "--out", tmp_path / "x", store=store.path)
    assert proc.returncode == 2 and "no run 999" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@needs_chromium
def test_markup_in_a_run_name_is_drawn_as_text():
    """Plotly draws the escaped run name as the literal text the user typed: no link, no bold, no placeholder."""
    import xml.etree.ElementTree as ET

    from test_plots import HOSTILE, hostile_run

    spec = build_figures([hostile_run(1, "idp_sample"), hostile_run(2, "ino")], names=["accuracy"])[0]
    root = ET.fromstring(export.figure_bytes(spec.figure, "svg", width=700, height=400))
    tags = {el.tag.rsplit("}", 1)[-1] for el in root.iter()}
    assert "a" not in tags  # no <a href> came out of the name
    texts = ["".join(el.itertext()) for el in root.iter() if el.tag.endswith("text")]
    assert f"{HOSTILE} #1" in texts and f"{HOSTILE} #2" in texts, [t for t in texts if "click" in t]
    bold = [el for el in root.iter() if "font-weight:bold" in (el.get("style") or "").replace(" ", "")]
    assert not bold


@pytest.mark.slow
def test_talk_figures_are_exported_and_packed(trained_runs, tmp_path):
    from engine.figures.talk import TALK_FIGURES
    from engine.figures.talk_frames import RHO_KEY
    from engine.jobs.runs import run_label

    assert set(TALK_FIGURES) <= set(export.figure_titles())
    names = [s.name for s in export.pack_figures(trained_runs)]
    assert {"privacy_frontier", "results_table"} <= set(names)
    assert "tif_sweep" not in names and "audit_tiers" not in names  # no sweep group, no audit: left out
    recorded = any(RHO_KEY in e for r in trained_runs for e in r["evals"])
    assert ("ino_internals" in names) == recorded
    z = zipfile.ZipFile(io.BytesIO(export.presentation_pack(trained_runs, names=["results_table", "privacy_frontier"],
                                                            formats=("html", "csv"))))
    assert sorted(n for n in z.namelist() if n.startswith("data/")) == ["data/01_results_table.csv",
                                                                        "data/02_privacy_frontier.csv"]
    table = pd.read_csv(io.BytesIO(z.read("data/01_results_table.csv")))
    assert list(table["algorithm"]) == [run_label(r) for r in trained_runs] and "ε=1 gain vs IDP, AUC (pp)" in table
    with pytest.raises(ValueError, match="unknown figure"):
        export.pack_figures(trained_runs, names=["nope"])
    store, ids = _store_with_runs(tmp_path)
    paths = export.export_runs(store, ids, formats=["csv"], out_dir=tmp_path / "out")
    assert {p.name for p in paths} >= {f"runs-{ids[0]}-{ids[1]}_privacy_frontier.csv",
                                       f"runs-{ids[0]}-{ids[1]}_results_table.csv"}


def test_slim_png_is_lossless_and_smaller():
    from PIL import Image, ImageChops

    im = Image.new("RGBA", (400, 300), (255, 255, 255, 255))
    for x in range(0, 400, 7):
        im.putpixel((x, x % 300), (200, 30, 30, 255))
    raw = io.BytesIO()
    im.save(raw, "PNG", compress_level=0)
    slim = export.slim_png(raw.getvalue())
    assert len(slim) < len(raw.getvalue())
    with Image.open(io.BytesIO(slim)) as out:
        assert out.mode == "RGB" and out.size == im.size
        assert ImageChops.difference(out.convert("RGBA"), im).getbbox() is None  # the same pixels
    see_through = Image.new("RGBA", (50, 50), (255, 255, 255, 0))
    buf = io.BytesIO()
    see_through.save(buf, "PNG")
    with Image.open(io.BytesIO(export.slim_png(buf.getvalue()))) as out:
        assert out.mode == "RGBA"  # transparency is kept
