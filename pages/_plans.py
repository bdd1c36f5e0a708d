"""The privacy plan shown before a launch (per-tier q, C, σ; steps; warnings), for training runs and audits.
Plans come from the engine (``engine.jobs.preview``, ``engine.audit.runner.preview_audit``), cached per config."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.audit.config import AuditConfig
from engine.audit.runner import preview_audit
from engine.config import ConfigError, RunConfig
from engine.data import DataError
from engine.jobs import preview
from pages import _common as ui


@st.cache_data(show_spinner=False, max_entries=128)
def _run_preview(config_json: str) -> dict:
    return preview(RunConfig.from_json(config_json))


@st.cache_data(show_spinner=False, max_entries=64)
def _audit_preview(config_json: str) -> dict:
    return preview_audit(AuditConfig.from_json(config_json), estimate=True)


def _planned(preview, config, errors: list[str], slots=None) -> dict | None:
    """The engine's preview of ``config`` (cached), or None after showing why there is none (next to the
    field that is wrong when ``slots``, a ``widgets.FieldSlots``, has one for it)."""
    try:
        with st.spinner("Planning…"):
            return preview(config.to_json())
    except (ConfigError, DataError) as e:
        errors.append(str(e))
        if not (slots is not None and isinstance(e, ConfigError) and slots.show(e)):
            ui.show_error(e)
        return None


def plan_frame(p: dict) -> pd.DataFrame:
    """One row per tier: owners, target ε and, for private runs, planned ε (None without a formal
    guarantee), q, C and σ (DP-SGD-S: its per-group clips change every step; σ is z_Δ)."""
    plan = p.get("plan")
    rows = []
    for k, name in enumerate(p["tier_names"]):
        row = {"tier": name, "owners": p["tier_sizes"][k], "ε target": p["target_epsilons"][k]}
        if plan:
            eps = plan.get("epsilons")
            row.update({"ε planned": None if eps is None else round(eps[k], 4),
                         "q (sample rate)": round(plan["sample_rates"][k], 5)})
            if plan.get("clip_norms") is None:  # DP-SGD-S
                row.update({"C (clip)": f"per group, {plan['c_min']:g}–{plan['c_max']:g} × {plan['base_clip']:g}",
                            "σ (noise mult.)": round(plan["gradient_noise_multiplier"], 4)})
            else:
                row.update({"C (clip)": round(plan["clip_norms"][k], 4),
                            "σ (noise mult.)": round(plan["noise_std"] / plan["clip_norms"][k], 4)})
        rows.append(row)
    return pd.DataFrame(rows)


def _plan_caption(p: dict) -> str:
    plan = p["plan"]
    extra = f" · INO tail γ = {p['tail_length']:.3g}" if p.get("tail_length") else ""
    head = f"{p['steps']} steps · expected batch {plan['expected_batch_size']:.1f}"
    if plan.get("noise_std") is None:  # DP-SGD-S: noise z_Δ · max_k C_k, clips from the tracked quantiles
        sizes = "declared" if plan.get("group_size_source") == "declared" else \
            f"released with noise σ = {plan.get('group_size_noise_std') or 0:.3g}"
        return (f"{head} · noise std z_Δ · max_k C_k per step, z_Δ = {plan['gradient_noise_multiplier']:.4g} · "
                f"C_k in [{plan['c_min']:g}, {plan['c_max']:g}] × C = {plan['base_clip']:g} · group sizes {sizes}")
    return f"{head} · noise std {plan['noise_std']:.4g} · σ* = {plan['noise_multiplier']:.4g}{extra}"


def run_plans(configs: list[RunConfig], errors: list[str], slots=None) -> dict[str, dict]:
    """One tab per algorithm with its plan; returns algorithm → preview (failures go to ``errors``)."""
    previews: dict[str, dict] = {}
    if not configs:
        return previews
    with st.expander("Privacy plan (per-tier q, C, σ) — computed before launching", expanded=True):
        for tab, cfg in zip(st.tabs([ui.algo_label(c.algorithm.name) for c in configs]), configs):
            with tab:
                p = _planned(_run_preview, cfg, errors, slots)
                if p is None:
                    continue
                previews[cfg.algorithm.name] = p
                plan = p.get("plan")
                if plan is None:
                    st.caption(f"Non-private reference: no clipping, no noise, no DP guarantee · {p['steps']} steps")
                else:
                    st.caption(ui.md(_plan_caption(p)))
                    for note in plan.get("notes") or []:
                        st.caption(ui.md(f"note: {note}"))
                if not p["formal_dp"] and cfg.algorithm.name != "nonprivate":
                    st.warning(ui.md(f"No formal DP guarantee: {p.get('formal_dp_reason') or 'see the plan'} "
                                     f"(ε spent is not reported)."))
                st.dataframe(plan_frame(p), hide_index=True, width="stretch")
    return previews


# --- run-time estimate before a launch -----------------------------------------------------------------------

FALLBACK_SECONDS_PER_SAMPLE = {"cnn": 4e-4, "mlp": 6e-5, "lr": 2e-5, "resnet18": 5e-3}  # one core, per sample-gradient (rough)


def seconds_per_sample(config: RunConfig, history: list[dict]) -> tuple[float, str]:
    """Seconds of training per sample-gradient for ``config``'s dataset and model: the median over the
    finished runs in the store that match (measured on this machine), else a rough per-model constant."""
    rates = []
    for r in history:
        cfg = r.get("config") or {}
        if r["status"] != "finished" or not r.get("started_at") or not r.get("finished_at") or not r.get("total_steps"):
            continue
        if (cfg.get("data") or {}).get("name") != config.data.name or \
                (cfg.get("model") or {}).get("name") != config.model.name:
            continue
        samples = r["total_steps"] * max(1, int(cfg.get("batch_size") or 1)) * max(1, int(cfg.get("seeds") or 1))
        rates.append((r["finished_at"] - r["started_at"]) / samples)
    if rates:
        rates.sort()
        return rates[len(rates) // 2], f"measured on this machine from {len(rates)} finished run(s)"
    model = config.model.name if config.model.name in FALLBACK_SECONDS_PER_SAMPLE else "cnn"
    return FALLBACK_SECONDS_PER_SAMPLE[model], "a rough estimate until a run of this dataset and model has finished"


def run_time_estimate(configs: list[RunConfig], previews: dict[str, dict], history: list[dict],
                      workers: int) -> tuple[float, str] | None:
    """(seconds, how) for the whole comparison: each run's steps × expected batch × seconds per sample,
    the runs shared out over ``workers`` worker processes."""
    total = []
    how = ""
    for cfg in configs:
        p = previews.get(cfg.algorithm.name)
        if p is None:
            return None
        batch = (p.get("plan") or {}).get("expected_batch_size") or cfg.batch_size
        rate, how = seconds_per_sample(cfg, history)
        total.append(p["steps"] * batch * max(1, int(getattr(cfg, "seeds", 1) or 1)) * rate)
    if not total:
        return None
    return max(max(total), sum(total) / max(1, workers)), how


def audit_plan(config: AuditConfig | None, errors: list[str]) -> dict | None:
    """The audit's plan (models, steps, groups, per-algorithm tiers) in an expander; None if it fails."""
    p = None if config is None else _planned(_audit_preview, config, errors)
    if p is None:
        return None
    est = p.get("estimate")
    if est:
        from engine.audit.estimate import format_seconds

        st.caption(f"Estimated runtime ≈ **{format_seconds(est['seconds'])}** of training — " + ui.md(est["how"])
                   + ". Statistics add seconds to a minute per algorithm.")
    with st.expander(f"Plan: {len(p['algorithms'])} × {p['n_models']} models of {p['steps_per_model']} steps on "
                     f"{p['n_train']} samples" + (f" + {p['looa_models']} PA-LOOA models each" if p["looa_models"] else ""),
                     expanded=False):
        sizes = ", ".join(f"{g}: {n}" for g, n in p["group_sizes"].items())
        st.caption(ui.md(f"Groups — {sizes} · trained {p['chunk_models']} models at a time on {p['device']}"))
        rows = [{"algorithm": a["label"], "tier": t["tier"], "q": t.get("sample_rate"), "C": t.get("clip_norm"),
                 "σ": t.get("noise_multiplier"), "ε claimed": t.get("epsilon"), "formal DP": "yes" if a["formal_dp"] else "no"}
                for a in p["algorithms"] for t in (a["plan"] or [{"tier": "—"}])]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    return p
