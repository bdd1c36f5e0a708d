"""The privacy plan shown before a launch (per-tier q, C, σ; steps; warnings), for training runs and audits.
Plans come from the engine (``engine.train.loop.preview``, ``engine.audit.pa_alooa.setup.preview_audit``), cached per
config; every number in their tables is the record's (σ per tier too: ``PlanRecord.tiers``).

(Helper modules of app_pages/ start with "_": app.py's navigation names the pages, these never are.)
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app_pages import _handles as handles
from app_pages._look import md, show_error, user_message
from engine.audit.pa_alooa.config import AuditConfig
from engine.audit.pa_alooa.setup import preview_audit
from engine.config.run import RunConfig
from engine.config.schema import ConfigError
from engine.data import DataError
from engine.dp.accounting import noise_saved_sentence
from engine.dp.algorithms import algorithm
from engine.jobs.estimates import format_seconds
from engine.jobs.runs import algorithm_label
from engine.train.loop import preview
from engine.train.records import PlanRecord


@st.cache_data(show_spinner=False, max_entries=128)
def _run_preview(config_json: str) -> PlanRecord:
    return preview(RunConfig.from_json(config_json))


@st.cache_data(show_spinner=False, max_entries=64)
def _audit_preview(config_json: str) -> dict:
    return preview_audit(AuditConfig.from_json(config_json), estimate=True)


def _planned(preview, config, errors: list[str], slots=None):
    """The engine's preview of ``config`` (cached), or None after showing why there is none (next to the
    field that is wrong when ``slots``, a ``_widgets.FieldSlots``, has one for it)."""
    try:
        with st.spinner("Planning…"):
            return preview(config.to_json())
    except (ConfigError, DataError) as e:
        errors.append(str(e))
        if not (slots is not None and isinstance(e, ConfigError) and slots.show(e)):
            show_error(e, user_terms=slots is not None)
        return None


def plan_frame(p: PlanRecord, rdp: PlanRecord | None = None) -> pd.DataFrame:
    """One row per tier (the record's ``PlanRecord.tiers``): owners, target ε and, for private runs, planned ε
    (None without a formal guarantee), q, C and σ — the record's per-tier σ_k (SCALE: σ*·C/C_k; DP-SGD-S: z_Δ,
    its per-group clips change every step). ``rdp``: the same settings' plan under RDP, whose q, C and σ are set
    beside (a plan under PRV or PLD)."""
    rows = []
    beside = {} if rdp is None or not rdp.private else {t.name: t for t in rdp.tiers}
    for t in p.tiers:
        row = {"tier": t.name, "owners": t.size, "ε target": t.target_epsilon}
        if p.private:
            row.update({"ε planned": None if t.epsilon is None else round(t.epsilon, 4),
                        "q (sample rate)": round(t.sample_rate, 5)})
            if p.group_clip is not None:  # moving clips (DP-SGD-S, DPSGD-F, Global-Adapt)
                row["C (clip)"] = f"per group, {p.group_clip.clip_range}"
            else:
                row["C (clip)"] = round(t.clip_norm, 4)
            row["σ (noise mult.)"] = round(t.noise_multiplier, 4)
            r = beside.get(t.name)
            if r is not None:
                row.update({"q under rdp": round(r.sample_rate, 5),
                            "C under rdp": None if r.clip_norm is None else round(r.clip_norm, 4),
                            "σ under rdp": round(r.noise_multiplier, 4)})
        rows.append(row)
    return pd.DataFrame(rows)


# what the plan caption's symbols are (said under it, once per plan)
SIGMA_STAR_TERMS = ("σ* is the noise multiplier the accountant planned for the tiers' ε: each step adds Gaussian "
                    "noise of std σ*·C to the sum of the clipped gradients (SCALE: per tier σ*·C/C_k in the table).")
Z_DELTA_TERMS = ("z_Δ is the gradient noise multiplier of an algorithm whose clips move (DP-SGD-S, DPSGD-F, "
                 "DPSGD-Global-Adapt): noise std z_Δ · max_k C_k per step, above the σ* DP-SGD plans at the same ε, "
                 "because the noisy counts that move the clips are paid for from the same budget.")


def _plan_terms(p: PlanRecord) -> str:
    return Z_DELTA_TERMS if p.group_clip is not None else SIGMA_STAR_TERMS


def _plan_caption(p: PlanRecord) -> str:
    extra = f" · INO tail γ = {p.tail_length:.3g}" if p.tail_length else ""
    head = f"{p.steps} steps · expected batch {p.expected_batch_size:.1f}"
    g = p.group_clip
    if g is not None:  # moving clips: noise z_Δ · max_k C_k, clips from noisy per-step counts
        sizes = "" if g.sizes_phrase is None else f" · group sizes {g.sizes_phrase}"
        return (f"{head} · noise std z_Δ · max_k C_k per step, z_Δ = {g.gradient_noise_multiplier:.4g} · "
                f"C_k in {g.clip_range}{sizes}")
    return f"{head} · noise std {p.noise_std:.4g} · σ* = {p.noise_multiplier:.4g}{extra}"


def run_plans(configs: list[RunConfig], errors: list[str], slots=None) -> dict[str, PlanRecord]:
    """One tab per algorithm with its plan; returns algorithm → its preview, the plan record (failures go
    to ``errors``)."""
    previews: dict[str, PlanRecord] = {}
    if not configs:
        return previews
    with st.expander("Privacy plan (per-tier q, C, σ) — computed before launching", expanded=True):
        for tab, cfg in zip(st.tabs([algorithm_label(c.algorithm.name) for c in configs]), configs):
            with tab:
                p = _planned(_run_preview, cfg, errors, slots)
                if p is None:
                    continue
                previews[cfg.algorithm.name] = p
                if not p.private:
                    st.caption(f"Non-private reference: no clipping, no noise, no DP guarantee · {p.steps} steps")
                else:
                    st.caption(md(_plan_caption(p)))
                    st.caption(md(_plan_terms(p)))
                    for note in p.notes or ():  # (the engine counts tiers from 0: the table's numbers)
                        st.caption(md(f"note: {user_message(note, labels=getattr(slots, 'tier_labels', None))}"))
                if not p.formal_dp and algorithm(cfg.algorithm.name).private:  # the reference: said above
                    st.warning(md(f"No formal DP guarantee: {p.formal_dp_reason or 'see the plan'} "
                                  f"(ε spent is not reported)."))
                rdp = _beside_rdp(p, cfg)
                st.dataframe(plan_frame(p, rdp), hide_index=True, width="stretch")
    _batch_hints(configs, previews, slots)
    return previews


def _batch_hints(configs: list[RunConfig], previews: dict[str, PlanRecord], slots) -> None:
    """A batch that is a large fraction of the training set (``RunConfig.batch_advisories``, once the preview knows
    the set's size; the same for every algorithm): a warning by the batch field, once."""
    n_train = next((p.n_train for p in previews.values() if p.n_train), None)
    if n_train is None:
        return
    for advice in configs[0].batch_advisories(n_train):
        if slots is None or not slots.warn(advice):
            st.warning(md(str(advice)), icon=":material/warning:")


def _beside_rdp(p: PlanRecord, cfg: RunConfig) -> PlanRecord | None:
    """A private plan under PRV or PLD: the same settings planned under RDP (cached), its noise said against
    this one's in a caption; None (and a caption saying why) when RDP cannot plan them."""
    if not p.private or (p.accountant or "rdp") == "rdp":
        return None
    try:
        rdp = _run_preview(cfg.replace(accountant="rdp").to_json())
    except (ConfigError, DataError) as e:
        st.caption(md(f"RDP could not plan these settings ({user_message(str(e))}): {p.accountant} can."))
        return None
    st.caption(md(noise_saved_sentence(p.accountant, p.noise_multiplier, rdp.noise_multiplier)))
    return rdp


def audit_plan(config: AuditConfig | None, errors: list[str]) -> dict | None:
    """The audit's plan (models, steps, groups, per-algorithm tiers) in an expander; None if it fails."""
    p = None if config is None else _planned(_audit_preview, config, errors)
    if p is None:
        return None
    est = p.get("estimate")
    if est:
        start, measured = handles.manager().start_estimate("audit")
        st.caption(f"Estimated runtime ≈ **{format_seconds(est['seconds'] + start)}** from Launch — " + md(est["how"])
                   + f"; the worker's start {start:.0f} s ({'measured on this machine' if measured else 'rough'}).")
    with st.expander(f"Plan: {len(p['algorithms'])} × {p['n_models']} models of {p['steps_per_model']} steps on "
                     f"{p['n_train']} samples" + (f" + {p['looa_models']} PA-LOOA models each" if p["looa_models"] else ""),
                     expanded=False):
        sizes = ", ".join(f"{g}: {n}" for g, n in p["group_sizes"].items())
        st.caption(md(f"Groups — {sizes} · trained {p['chunk_models']} models at a time on {p['device']}"))
        rows = [{"algorithm": a["label"], "tier": t["tier"], "q": t.get("sample_rate"), "C": t.get("clip_norm"),
                 "σ": t.get("noise_multiplier"), "ε claimed": t.get("epsilon"), "formal DP": "yes" if a["formal_dp"] else "no"}
                for a in p["algorithms"] for t in (a["plan"] or [{"tier": "—"}])]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        if any(a.get("control") for a in p["algorithms"]):
            st.caption("The controls are planned while the audit runs: noise-matched DP-SGD at the noise multiplier "
                       "DP-SGD-S realises (its ε follows from it), accuracy-matched DP-SGD at the ε a short search "
                       "finds on a few pilot models.")
    return p
