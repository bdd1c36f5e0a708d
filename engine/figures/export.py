"""Figure export: PNG / SVG / PDF (Kaleido + Chromium), self-contained HTML, CSV data, JSON configs,
and a zipped "presentation pack". Shared by the dashboard and ``python -m engine export``.

Static images need a Chromium-family browser (Kaleido ≥ 1 drives one; Debian's ``/usr/bin/chromium``
is found automatically). Without one, PNG/SVG/PDF raise :class:`ExportUnavailable` with a message
the UI shows as is, while HTML, CSV and JSON keep working.
"""
from __future__ import annotations

import atexit
import functools
import io
import json
import os
import re
import shutil
import threading
import time
import zipfile
from pathlib import Path

from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.one_run.config import OneRunConfig
from engine.config.schema import ConfigError
from engine.figures.frames import run_evals
from engine.figures.audit import build_audit_figures
from engine.figures.one_run import build_one_run_figures
from engine.figures.scaffold import FigureSpec
from engine.figures.talk import TALK_FIGURES, build_talk_figures
from engine.figures.training import LIVE_FIGURES, RESULT_FIGURES, build_figures
from engine.jobs.runs import run_config, run_record
from engine.store.artifacts import load_array

STATIC_FORMATS = ("png", "svg", "pdf")
FORMATS = STATIC_FORMATS + ("html", "csv", "json")
MIME = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf", "html": "text/html",
        "csv": "text/csv", "json": "application/json", "zip": "application/zip"}

_CHROME_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
_lock = threading.RLock()


class ExportUnavailable(RuntimeError):
    """Static image export is not possible here (no Chromium); HTML/CSV/JSON still work."""


def chromium_path() -> str | None:
    """The browser Kaleido will use, or None. ``BROWSER_PATH`` wins (Kaleido honours it too)."""
    env = os.environ.get("BROWSER_PATH")
    if env and os.path.exists(env):
        return env
    for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(p):
            return p
    for name in _CHROME_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def static_export_available() -> tuple[bool, str]:
    """(available, reason): the reason says what to install when it is not."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False, "PNG/SVG/PDF export needs the kaleido package (pip install kaleido); HTML export still works."
    if chromium_path() is None:
        return False, ("PNG/SVG/PDF export needs Chromium (Debian/Ubuntu: apt-get install chromium), which was not "
                       "found; HTML, CSV and JSON export still work.")
    return True, ""


class _Renderer:
    """One headless Chromium (Kaleido, one tab) on a private event-loop thread, for every static export of
    this process (the first image ~2 s, then ~0.2 s each). :meth:`render` renders a batch of figures one
    after another (Kaleido 1.5 with concurrent renders or two tabs: only 1.2× faster, and stalls of ~5 s
    every few batches); :meth:`submit` returns at once, so the caller works while the browser renders."""

    def __init__(self):
        self.loop = self.kaleido = self.serial = None

    def start(self) -> None:
        import asyncio

        import kaleido

        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="kaleido-renderer", daemon=True).start()
        k = kaleido.Kaleido(n=1)
        try:
            asyncio.run_coroutine_threadsafe(k.open(), loop).result(timeout=120)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            raise
        self.loop, self.kaleido = loop, k

    def render(self, jobs: list[tuple[dict, dict]]) -> list[bytes]:
        """Bytes of each (figure dict, Kaleido opts) job, in order."""
        return self.submit(jobs).result(timeout=60 + 30 * len(jobs))

    def submit(self, jobs: list[tuple[dict, dict]]):
        """A concurrent.futures.Future of :meth:`render`'s result."""
        import asyncio

        if self.kaleido is None:
            self.start()

        async def batch():  # one after another, batches too: concurrent calc_fig calls stall ~5 s every few
            if self.serial is None:  # (created on the loop's own thread)
                self.serial = asyncio.Lock()
            async with self.serial:
                return [await self.kaleido.calc_fig(fig, opts=opts) for fig, opts in jobs]

        return asyncio.run_coroutine_threadsafe(batch(), self.loop)

    def stop(self) -> None:
        import asyncio

        loop, k, self.loop, self.kaleido, self.serial = self.loop, self.kaleido, None, None, None
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(k.close(), loop).result(timeout=20)
        except Exception:  # noqa: BLE001 - a browser that is already gone
            pass
        loop.call_soon_threadsafe(loop.stop)


_renderer = _Renderer()
atexit.register(_renderer.stop)


def _static_batch(jobs: list[tuple[object, str]], width: int, height: int, scale: float) -> list[tuple[dict, dict]]:
    """The renderer's (figure dict, Kaleido opts) jobs of (figure, format) jobs; refuses an unknown format
    and a machine without Chromium (:class:`ExportUnavailable`, with what to install)."""
    for _, fmt in jobs:
        if fmt not in STATIC_FORMATS:
            raise ValueError(f"unknown image format {fmt!r}; allowed: {', '.join(STATIC_FORMATS + ('html',))}")
    ok, reason = static_export_available()
    if not ok:
        raise ExportUnavailable(reason)
    return [(fig.to_dict() if hasattr(fig, "to_dict") else dict(fig),
             {"format": fmt, "width": int(width), "height": int(height), "scale": float(scale)}) for fig, fmt in jobs]


def render_static(jobs: list[tuple[object, str]], *, width: int = 1000, height: int = 600,
                  scale: float = 2.0) -> list[bytes]:
    """png/svg/pdf bytes of each (figure, format) job, rendered one after another (Kaleido + Chromium)."""
    batch = _static_batch(jobs, width, height, scale)
    from kaleido.errors import ChromeNotFoundError

    with _lock:
        try:
            return _renderer.render(batch)
        except ChromeNotFoundError as e:
            raise ExportUnavailable(f"Kaleido could not start Chromium: {e}") from None
        except Exception:  # noqa: BLE001 - a dead browser: restart it once
            _renderer.stop()
            try:
                return _renderer.render(batch)
            except ChromeNotFoundError as e:
                raise ExportUnavailable(f"Kaleido could not start Chromium: {e}") from None


def render_static_later(jobs: list[tuple[object, str]], *, width: int = 1000, height: int = 600,
                        scale: float = 2.0):
    """Start :func:`render_static` of ``jobs`` and return at once: a function that waits for its bytes
    (the caller works meanwhile, e.g. on the previous figure of a pack). Hold ``_lock`` until it returns."""
    batch = _static_batch(jobs, width, height, scale)
    try:
        future = _renderer.submit(batch)
    except Exception:  # noqa: BLE001 - no browser yet or a dead one: render_static starts (or restarts) it
        future = None

    def wait() -> list[bytes]:
        try:
            if future is not None:
                return future.result(timeout=60 + 30 * len(batch))
        except Exception:  # noqa: BLE001 - a dead browser: render_static restarts it once
            _renderer.stop()
        return render_static(jobs, width=width, height=height, scale=scale)
    return wait


def figure_bytes(fig, fmt: str, *, width: int = 1000, height: int = 600, scale: float = 2.0) -> bytes:
    """Render one figure: png/svg/pdf (Kaleido), html (self-contained, plotly.js inlined)."""
    fmt = fmt.lower()
    if fmt == "html":
        return html_bytes(fig)
    return render_static([(fig, fmt)], width=width, height=height, scale=scale)[0]


def html_bytes(fig, *, plotlyjs: str | None = None) -> bytes:
    """A full HTML page: plotly.js inlined (self-contained), or loaded from ``plotlyjs`` (a file name
    beside the page: the presentation pack's one shared copy)."""
    include = True if plotlyjs is None else plotlyjs
    return fig.to_html(include_plotlyjs=include, full_html=True, config={"displaylogo": False}).encode("utf-8")


def csv_bytes(df) -> bytes:
    return df.to_csv(index=False).encode("utf-8")


def configs_json(runs: list[dict]) -> bytes:
    """The run configs (validated engine JSON) with ids, status, plan and summary."""
    out = [{"id": r["id"], "name": r.get("name") or "", "algorithm": r.get("algorithm"), "status": r.get("status"),
            "group_id": r.get("group_id"), "config": r.get("config"), "plan": r.get("plan"),
            "summary": r.get("summary"), "versions": r.get("versions")} for r in runs]
    return json.dumps(out, indent=2, sort_keys=True, default=str).encode("utf-8")


TIER_METRICS = ("loss", "recall", "accuracy", "epsilon", "epsilon_spent", "n")  # a tier's rows of the metrics CSV


def metrics_csv(run: dict) -> bytes:
    """All evaluations of one run as a tidy CSV: step, epoch, scope (overall/tier/class), group, metric, value."""
    import pandas as pd

    rows = []
    for e in run_evals(run):
        base = {"run_id": run["id"], "step": e.step, "epoch": e.epoch, "elapsed": e.elapsed}
        for k, v in e.overall.to_dict().items():
            rows.append({**base, "scope": "overall", "group": "", "metric": k, "value": v})
        for t in e.tiers:
            for k in TIER_METRICS:
                if k != "n" or t.n is not None:  # a tier's size: where recorded
                    rows.append({**base, "scope": "tier", "group": t.name, "metric": k, "value": getattr(t, k)})
        for c, m in enumerate(e.classes):
            for k in ("loss", "recall", "accuracy"):
                rows.append({**base, "scope": "class", "group": m.name if m.name is not None else str(c),
                             "metric": k, "value": getattr(m, k)})
        for k, v in (e.fairness.to_dict() if e.fairness is not None else {}).items():
            rows.append({**base, "scope": "fairness", "group": "", "metric": k, "value": v})
        for k, v in enumerate((e.group_clip.clip_norms or ()) if e.group_clip is not None else ()):
            rows.append({**base, "scope": "group_clip", "group": str(k), "metric": "clip_norm", "value": v})
    cols = ["run_id", "step", "epoch", "elapsed", "scope", "group", "metric", "value"]
    return pd.DataFrame(rows, columns=cols).to_csv(index=False).encode("utf-8")


def audit_advantages_csv(store, run_id: int, keys) -> bytes:
    """An audit's per-sample advantages as CSV: one column per algorithm key (artifacts ``advantage/{key}``)."""
    import numpy as np
    import pandas as pd

    cols = {}
    for k in keys:
        blob = store.get_artifact(run_id, f"advantage/{k}")
        if blob is not None:
            cols[f"advantage_{k}"] = load_array(blob)
    df = pd.DataFrame(cols)
    df.insert(0, "sample", np.arange(len(df)))
    return df.to_csv(index=False).encode("utf-8")


def results_json(results: dict) -> bytes:
    """An audit's results (the run's summary) as indented, key-sorted JSON."""
    return json.dumps(results, indent=2, sort_keys=True, default=str).encode("utf-8")


def load_runs(store, run_ids) -> list[dict]:
    """Run records (run dict + evals) for the ids that exist, in the given order."""
    out = []
    for rid in run_ids:
        rec = run_record(store, int(rid))
        if rec is None:
            raise ConfigError("run_ids", f"no run {rid} in {store.path}")
        out.append(rec)
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "figure"


# an audit's figures by the type of its configuration (read through the job-kind registry): PA-ALOOA's GPR bars,
# Δ table … (engine.figures.audit); a one-run audit's claimed-vs-empirical ε (engine.figures.one_run)
AUDIT_FIGURE_BUILDERS = {AuditConfig: build_audit_figures, OneRunConfig: build_one_run_figures}


def audit_figures(runs: list[dict], *, theme: str = "light") -> list[FigureSpec]:
    """The figures of the audits among run records (those with a stored summary, a partial one too), each by its
    kind's builder (:data:`AUDIT_FIGURE_BUILDERS`); with several audits each name ends in its run id."""
    audits = [r for r in runs if r.get("summary") and type(run_config(r)) in AUDIT_FIGURE_BUILDERS]
    out = []
    for run in audits:
        for spec in AUDIT_FIGURE_BUILDERS[type(run_config(run))](run["summary"], theme=theme):
            if len(audits) > 1:
                spec.name = f"{spec.name}_{run['id']}"
            out.append(spec)
    return out


def export_runs(store, run_ids, *, formats=("png",), out_dir="export", width: int = 1000, height: int = 600,
                scale: float = 2.0, theme: str = "light") -> list[Path]:
    """Write every figure of the selected runs in each format into ``out_dir``; returns the paths.

    png/svg/pdf/html: one file per figure; csv: the data behind each figure; json: ``configs.json``. A one-run
    audit has no training curves: it gives its own figures instead (:func:`audit_figures`).
    Raises ConfigError for unknown run ids and ExportUnavailable for static formats without Chromium.
    """
    formats = [f.lower() for f in (formats or ["png"])]
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"unknown export format {bad[0]!r}; allowed: {', '.join(FORMATS)}")
    if any(f in STATIC_FORMATS for f in formats):
        ok, reason = static_export_available()
        if not ok:
            raise ExportUnavailable(reason)
    runs = load_runs(store, run_ids)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = "runs-" + "-".join(str(r["id"]) for r in runs)
    paths: list[Path] = []
    trained = [r for r in runs if type(run_config(r)) not in AUDIT_FIGURE_BUILDERS]  # an audit: its own figures
    specs = all_figures(trained, theme=theme, skip_empty=True) + audit_figures(runs, theme=theme)
    for spec in specs:
        for fmt in formats:
            if fmt == "json":
                continue
            path = out / f"{prefix}_{_safe(spec.name)}.{fmt}"
            if fmt == "csv":
                path.write_bytes(csv_bytes(spec.data))
            else:
                path.write_bytes(figure_bytes(spec.figure, fmt, width=width, height=height, scale=scale))
            paths.append(path)
    if "json" in formats:
        path = out / f"{prefix}_configs.json"
        path.write_bytes(configs_json(runs))
        paths.append(path)
    return paths


PACK_FORMATS = ("png", "svg", "pdf", "html", "csv")
PLOTLY_JS = "plotly.min.js"  # the one copy of plotly.js every HTML file of a pack loads from beside it


def all_figures(runs: list[dict], *, theme: str = "light", names=None, audit=None, skip_empty: bool = False) -> list:
    """The training figures (:func:`engine.figures.training.build_figures`) and the talk figures
    (:func:`engine.figures.talk.build_talk_figures`; ``audit``: an audit report for ``audit_tiers``) of
    ``runs``, in the order of ``names`` (default: training figures, then talk figures)."""
    names = list(names) if names is not None else list(LIVE_FIGURES + RESULT_FIGURES + TALK_FIGURES)
    bad = [n for n in names if n not in LIVE_FIGURES + RESULT_FIGURES + TALK_FIGURES]
    if bad:
        raise ValueError(f"unknown figure {bad[0]!r}; allowed: {', '.join(LIVE_FIGURES + RESULT_FIGURES + TALK_FIGURES)}")
    train = build_figures(runs, theme=theme, names=[n for n in names if n not in TALK_FIGURES], skip_empty=skip_empty)
    talk = build_talk_figures(runs, theme=theme, names=[n for n in names if n in TALK_FIGURES], audit=audit,
                              skip_empty=skip_empty)
    by_name = {s.name: s for s in train + talk}
    return [by_name[n] for n in names if n in by_name]


def pack_figures(runs: list[dict], *, theme: str = "presentation", names=None, audit=None) -> list:
    """The figures a presentation pack of ``runs`` can hold (the picker's options), in pack order."""
    return all_figures(runs, theme=theme, names=names, audit=audit, skip_empty=True)


@functools.lru_cache(maxsize=1)
def figure_titles() -> dict[str, str]:
    """Figure name → title, for every figure a pack can hold (the picker's labels; cheap: no data)."""
    return {s.name: s.title for s in all_figures([])}


def slide_table(fig, *, width: int, height: int, rows: int):
    """A table figure restyled to fill a ``width`` × ``height`` slide: large fonts, tall rows, columns
    as wide as their longest text."""
    body = max(120, height - 160)  # title and margins
    row_h = max(28, min(90, body // max(rows + 1, 2)))
    font = max(14, min(36, int(row_h * 0.5), int(width / 60)))
    import plotly.graph_objects as go

    fig = go.Figure(fig)  # a copy: the dashboard's figure keeps its own size
    for t in fig.data:
        if t.type == "table":
            cols = zip(t.header.values or (), t.cells.values or ())
            t.columnwidth = [min(24, max([len(str(h)) / 2] + [len(str(v)) for v in c])) + 2 for h, c in cols]
    fig.update_traces(header=dict(height=row_h, font=dict(size=font)), cells=dict(height=row_h, font=dict(size=font)),
                      selector=dict(type="table"))
    fig.update_layout(width=width, height=height, margin=dict(l=40, r=40, t=100, b=40), title_font_size=font + 10)
    return fig


def slim_png(data: bytes) -> bytes:
    """A PNG re-encoded smaller and lossless: an alpha channel that is opaque everywhere dropped (Kaleido
    writes RGBA), zlib level 6 — about 40 % smaller for slide-sized figures at ~0.1 s each. Unchanged
    when Pillow is missing or the result is not smaller."""
    try:
        from PIL import Image
    except ImportError:
        return data
    with Image.open(io.BytesIO(data)) as im:
        if im.mode == "RGBA" and im.getextrema()[3][0] == 255:
            im = im.convert("RGB")
        out = io.BytesIO()
        im.save(out, "PNG", compress_level=6)
    return out.getvalue() if out.tell() < len(data) else data


def presentation_pack(runs: list[dict], *, names=None, width: int = 1600, height: int = 900, scale: float = 2.0,
                      theme: str = "presentation", formats=PACK_FORMATS, progress=None, audit=None) -> bytes:
    """A zip with the figures of a comparison for slides (light, large fonts), their data and the configs.

    ``names``: the figures to include (the picker's choice; default all of :func:`pack_figures`, the talk
    figures included; ``audit``: an audit report for the audit figure and the table's Δ).
    The HTML files share one ``html/plotly.min.js`` (a zip of 11 figures stays a few MB); tables are
    slide-sized. ``progress(done, total, title)`` is called before each figure and once at the end.
    Without Chromium the static formats are left out and README.txt says why.
    """
    from plotly.offline import get_plotlyjs

    ok, reason = static_export_available()
    specs = pack_figures(runs, theme=theme, names=names, audit=audit)
    buf = io.BytesIO()
    notes = [f"Privacy Imbalance Lab presentation pack — runs {', '.join(str(r['id']) for r in runs)}",
             f"created {time.strftime('%Y-%m-%d %H:%M:%S')}, {width}×{height} px at scale {scale}, theme {theme}",
             f"HTML files load {PLOTLY_JS} from their folder: keep the html/ folder together.", ""]
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        static = [f for f in formats if f in STATIC_FORMATS] if ok else []

        def write(stem: str, spec, fig, images: dict) -> None:
            for fmt in formats:
                if fmt in images:
                    img = images[fmt]
                    z.writestr(f"{fmt}/{stem}.{fmt}", slim_png(img) if fmt == "png" else img)
                elif fmt == "html":
                    z.writestr(f"html/{stem}.html", html_bytes(fig, plotlyjs=PLOTLY_JS))
                elif fmt == "csv":
                    z.writestr(f"data/{stem}.csv", csv_bytes(spec.data))
            notes.append(f"{stem}: {spec.title}")

        # a pipeline: the browser renders figure i while this thread writes figure i - 1 (PNG re-encoding,
        # HTML, CSV), so the Python work and Chromium's share the two cores
        with _lock:
            pending = None
            for i, spec in enumerate(specs):
                if progress is not None:
                    progress(i, len(specs), spec.title)
                stem = f"{i + 1:02d}_{_safe(spec.name)}"
                fig = spec.figure
                if any(t.type == "table" for t in fig.data):
                    fig = slide_table(fig, width=width, height=height, rows=len(spec.data))
                wait = render_static_later([(fig, f) for f in static], width=width, height=height,
                                           scale=scale) if static else (lambda: [])
                if pending is not None:
                    write(*pending[:3], dict(zip(static, pending[3]())))
                pending = (stem, spec, fig, wait)
            if pending is not None:
                write(*pending[:3], dict(zip(static, pending[3]())))
        if "html" in formats and specs:
            z.writestr(f"html/{PLOTLY_JS}", get_plotlyjs())
        z.writestr("configs.json", configs_json(runs))
        if not ok:
            notes += ["", reason]
        z.writestr("README.txt", "\n".join(notes) + "\n")
    if progress is not None:
        progress(len(specs), len(specs), "done")
    return buf.getvalue()
