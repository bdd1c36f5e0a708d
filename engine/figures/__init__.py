"""The lab's figures: tidy frames computed once, plotted by separate pure functions (Fairlearn style).

* :mod:`engine.figures.scaffold` — themes, palettes, base/empty figures, facet grids, tables,
  :class:`~engine.figures.scaffold.FigureSpec`, and :func:`~engine.figures.scaffold.esc`, the one
  escaping rule for user text in titles, legends and hover text;
* :mod:`engine.figures.frames` / :mod:`engine.figures.training` — training runs: frames (with ``seed`` and
  ``series`` columns), figures and :func:`~engine.figures.training.build_figures` (dashboard,
  ``python -m engine export``, packs); :mod:`engine.figures.curves` computes each curve figure as a plan
  that :func:`~engine.figures.scaffold.render` draws, :mod:`engine.figures.bands` holds seed bands,
  smoothing, the x-axis choice and the divergence rule, and :mod:`engine.figures.live` patches kept
  figures on a live refresh (:class:`~engine.figures.live.LiveFigures`);
* :mod:`engine.figures.talk` / :mod:`engine.figures.talk_frames` — the plots a talk needs (frontier, INO
  internals, DP-SGD-S clips, TIF sweep heatmap, audit GPR vs ε, a results slide);
* :mod:`engine.figures.audit` — a privacy audit (frames on :class:`engine.audit.pa_alooa.report.AuditReport`);
* :mod:`engine.figures.one_run` — a one-run audit: claimed vs empirical ε per tier
  (:meth:`engine.audit.one_run.report.OneRunReport.frame`);
* :mod:`engine.figures.explorer` — the TIF explorer (its compute is :mod:`engine.tools.tif_explorer`).

Run records and their labels live in :mod:`engine.jobs.runs`. Figure builders never read the store, never
mutate their inputs and never call Streamlit. Themes: ``"light"``, ``"dark"`` and ``"presentation"``
(light, large fonts, thick lines: slides).

Layer 9 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli:
may import engine.jobs (run records), engine.audit (reports) and
everything below them; nothing here reads the store or calls Streamlit.
"""
