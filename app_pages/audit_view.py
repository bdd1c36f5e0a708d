"""Audit: two sections, picked at the top (``?section=``). PA-ALOOA group privacy risk (``app_pages/_pa_alooa.py``):
configure, launch in the background, watch, cancel/resume, and read GPR per group, the Δ table, accuracy, per-tier
ε lower bounds, LiRA ROC and advantage histograms. The one-run audit (``app_pages/_one_run.py``): per-tier empirical
ε̂ from one training run per algorithm."""
from __future__ import annotations

import streamlit as st

from app_pages import _handles as handles
from app_pages import _one_run as one_run
from app_pages import _pa_alooa as pa_alooa
from app_pages import _widgets as widgets
from app_pages._look import intro
from engine.jobs.runs import algorithm_label

st.title("Privacy audit")
intro()
url = widgets.UrlParams(labels={"a_algos": algorithm_label})
mgr = handles.manager()
# One section or the other, and the script runs to its end, never st.stop(): Streamlit keeps the state of the
# widgets a stopped run did not draw while the browser draws them anew, so the hidden section's tier table came
# back from its start while the page read the old edits
if one_run.section_picker() == one_run.ONE_RUN:
    one_run.page(mgr, mgr.store, url)
else:
    pa_alooa.page(mgr, mgr.store, url)
