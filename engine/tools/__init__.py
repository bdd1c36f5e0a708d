"""The lab's tools built on the engine: the TIF explorer, the TIF sweep, the embedded demo.

    tif_explorer.py  a sampled batch's ρ per item, the per-tier summary (no training)
    sweep.py         a TIF sweep's configs (IDP-SGD reference + one INO-SGD run per cell), grids, estimate
    demo.py          the embedded default comparison and its example runs (``python -m engine.tools.demo``)

Layer 10 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: may import engine.figures and everything below it; only engine.cli imports it.
"""
