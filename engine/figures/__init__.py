"""The lab's figures: tidy frames computed once, plotted by separate pure functions (Fairlearn style).

* :mod:`engine.figures.scaffold` — themes, palettes, base/empty figures, facet grids, tables,
  :class:`~engine.figures.scaffold.FigureSpec`, and :func:`~engine.figures.scaffold.esc`, the one
  escaping rule for user text in titles, legends and hover text;
* :mod:`engine.figures.frames` / :mod:`engine.figures.training` — training runs: frames, figures and
  :func:`~engine.figures.training.build_figures` (dashboard, ``python -m engine export``, packs);
* :mod:`engine.figures.audit` — a privacy audit (frames on :class:`engine.audit.report.AuditReport`);
* :mod:`engine.figures.explorer` — the TIF explorer (its compute is :mod:`engine.tif_explorer`).

Run records and their labels live in :mod:`engine.runs`. Figure builders never read the store, never
mutate their inputs and never call Streamlit. Themes: ``"light"``, ``"dark"`` and ``"presentation"``
(light, large fonts, thick lines: slides).
"""
