"""Group privacy risk (PA-ALOOA) and outcome fairness: non-private vs DP-SGD vs DP-SGD-S (issue 11 §4, §5).

    python experiments/group_risk.py --quick      Adult (sex) LR 2R = 100, MNIST-10k LR 2R = 50 (~20 min, 2 cores)
    python experiments/group_risk.py              2R = 400 everywhere (CPU overnight / GPU)

Each audit is an engine ``AuditConfig`` run by ``engine.audit.pa_alooa.runner.run_audit`` into the run store: per
dataset and ε ∈ {1, 10}, DP-SGD and DP-SGD-S (the non-private reference once); reported per group GPR with
its bootstrap CI, Δ (pp) with CI, the null floor and test accuracy. The tiered setting audits IDP-SGD and
INO-SGD on MNIST class tiers (GPR per tier vs its ε). Outcome fairness: Adult runs trained by
``engine.train.loop.train`` (one tier at ε), demographic parity and equalized odds differences from the engine's
evaluation, mean ± s.e. over seeds.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common  # noqa: E402
from experiments.common import ConfigError, finite, mean_se, pm  # noqa: E402
from engine.audit.pa_alooa.config import AuditConfig
from engine.config.run import AlgorithmConfig
from engine.dp.algorithms import algorithm
from engine.figures.audit import fig_gpr_bars
from engine.figures.talk import fig_audit_tiers
from engine.figures.talk_frames import audit_tier_frame
from engine.figures.training import fig_fairness_bars
from engine.jobs.kinds import execute

NAME = "group_risk"
SECTIONS = ("adult", "mnist10k", "tiered", "fairness")


def _private(algo: dict) -> bool:
    """Whether the algorithm (a spec's dict) trains under an ε (its registry entry): the non-private reference
    has none, so it is audited once, with the largest ε."""
    return algorithm(algo.get("name", AlgorithmConfig.name)).private


def _mode(spec: dict, mode: str) -> dict:
    modes = spec["modes"]
    if mode not in modes:
        raise ConfigError("mode", f"this experiment has no {mode} mode (it has: {', '.join(modes)})")
    m = modes[mode]
    if not isinstance(m, dict):
        raise ConfigError(f"modes.{mode}", "must be an object of per-section overrides")
    return m


def audit_config(section: dict, overrides: dict, *, algorithms: dict, epsilon: float | None, device, threads):
    """The validated AuditConfig of one audit: the section's ``audit`` + ``algorithms`` (+ ``epsilon``)."""

    d = common.with_overrides(section["audit"], overrides)
    d["algorithms"] = list(algorithms.values())
    if epsilon is not None:
        d["epsilon"] = epsilon
    run_extra = {k: v for k, v in (("device", device), ("threads", threads)) if v is not None}
    if run_extra:
        d = common.with_overrides(d, {f"run.{k}": v for k, v in run_extra.items()})
    return AuditConfig.from_dict(d).validate()


def run_audit_into(store, config, name: str, backend=None):
    rid = store.create_run(config.to_dict(), kind="audit", status="queued", name=name)
    return rid, execute(store, rid, config, kind="audit", backend=backend)


def algo_rows(report, keys: list[str]) -> dict:
    """Per algorithm: accuracy, GPR per group (value, CI) and its own null floor, Δ (pp, CI), the null Δ spread,
    resolved (Δ's CI above that spread), the pooled null floor, formal DP."""
    out = {}
    for key, a in zip(keys, report.algorithms):
        out[key] = {"label": a.label, "formal_dp": a.formal_dp,
                    "accuracy": finite(100.0 * a.accuracy.mean) if a.accuracy.mean is not None else None,
                    "accuracy_sd": finite(100.0 * a.accuracy.std) if a.accuracy.std is not None else None,
                    "gpr": {g: {"value": finite(e.value), "low": finite(e.low), "high": finite(e.high)}
                            for g, e in a.gpr.items()},
                    "delta_pp": {"value": finite(a.delta.value), "low": finite(a.delta.low), "high": finite(a.delta.high)},
                    "null_floor": finite(a.null_floor),
                    "null_groups": {g: finite(v) for g, v in a.null_groups.items()},
                    "null_delta_pp": None if a.null_delta is None else
                    {"value": finite(a.null_delta.value), "low": finite(a.null_delta.low),
                     "high": finite(a.null_delta.high)},
                    "resolved": a.resolved,
                    "claimed_epsilon": [finite(t.claimed) for t in a.epsilon],
                    "epsilon_lower_bound": [finite(t.lower_bound) for t in a.epsilon]}
    return out


def run_experiment(args) -> tuple[dict, str]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = common.load_spec_sections(args.config, ("audits", "tiered", "fairness", "modes"))
    mode = _mode(spec, args.mode)
    store = common.open_store(common.store_path(args, NAME))
    started = time.time()
    result = {"mode": args.mode, "config": Path(args.config).name, "store": str(store.path), "audits": {}}
    reports = {}

    def log(msg):
        sys.stderr.write(f"[{time.time() - started:7.1f}s] {msg}\n")

    for ds_key, section in spec["audits"].items():
        over = mode.get(ds_key, {})
        algos = section["algorithms"]
        eps_list = section.get("epsilons", [10.0])
        per = {}
        for i, eps in enumerate(eps_list):
            # the non-private reference has no ε: audited once, with the largest ε's audit
            chosen = {k: a for k, a in algos.items() if _private(a) or eps == max(eps_list)}
            cfg = audit_config(section, over, algorithms=chosen, epsilon=float(eps), device=args.device,
                               threads=args.threads)
            t0 = time.time()
            rid, rep = run_audit_into(store, cfg, f"{NAME} {ds_key} ε={eps:g}", args.backend)
            reports[f"{ds_key}/eps{eps:g}"] = rep
            per[f"eps{eps:g}"] = {"run_id": rid, "R": cfg.R, "n_models_per_algorithm": cfg.n_models,
                                  "threshold": rep.threshold, "steps_per_model": rep.steps_per_model,
                                  "groups": list(rep.group_names), "group_sizes": dict(rep.group_sizes),
                                  "seconds": round(time.time() - t0, 1), "algorithms": algo_rows(rep, list(chosen))}
            log(f"audit {ds_key} ε={eps:g} (2R = {cfg.n_models}) done: run {rid}")
        result["audits"][ds_key] = per
    tiered = spec["tiered"]
    cfg = audit_config(tiered, mode.get("tiered", {}), algorithms=tiered["algorithms"], epsilon=None,
                       device=args.device, threads=args.threads)
    t0 = time.time()
    rid, rep = run_audit_into(store, cfg, f"{NAME} tiered", args.backend)
    reports["tiered"] = rep
    eps_of = {t.name: t.epsilon for t in cfg.run.tiers.tiers}
    rows = algo_rows(rep, list(tiered["algorithms"]))
    for row in rows.values():
        row["gpr_by_tier"] = [{"tier": g, "epsilon": eps_of.get(g), **v} for g, v in row["gpr"].items()]
    result["tiered"] = {"run_id": rid, "R": cfg.R, "n_models_per_algorithm": cfg.n_models, "threshold": rep.threshold,
                        "seconds": round(time.time() - t0, 1), "algorithms": rows}
    log(f"tiered audit done: run {rid}")
    result["fairness"] = fairness(spec["fairness"], mode.get("fairness", {}), store, args, log)
    result["wall_seconds"] = round(time.time() - started, 1)
    out = common.figures_dir(args, NAME)
    if out is not None:
        result["figures"] = [str(p) for p in export_figures(out, f"{NAME}_{args.mode}", reports, result) if p]
    return result, markdown(result)


def fairness(section: dict, over: dict, store, args, log) -> dict:
    """Adult runs per (algorithm, ε, seed); DP / EO differences and accuracy, mean ± s.e. over seeds."""

    over = dict(over)
    seeds = over.pop("seeds", section.get("seeds", [0]))
    out = {"seeds": list(seeds)}
    for eps in section.get("epsilons", [10.0]):
        tiers = {"assign": "class", "tiers": [{"epsilon": float(eps), "classes": [0, 1], "name": f"all (ε={eps:g})"}]}
        per = {}
        for key, algo in section["algorithms"].items():
            if not _private(algo) and eps != max(section["epsilons"]):  # (no ε: once)
                continue
            vals = {"demographic_parity_difference": [], "equalized_odds_difference": [], "accuracy": []}
            runs = [(common.run_config(common.with_overrides(section["base"], {"tiers": tiers}), over, algorithm=algo,
                                       seed=s, device=args.device, threads=args.threads,
                                       name=f"{key} ε={eps:g} seed {s}"), f"{NAME}-fairness-eps{eps:g}-seed{s}")
                    for s in seeds]
            trained = common.train_runs(store, runs, reuse=args.reuse, backend=args.backend)
            ids = [rid for rid, _ in trained]
            for _, summary in trained:
                fair = summary.fairness
                for m in ("demographic_parity_difference", "equalized_odds_difference"):
                    vals[m].append(None if fair is None else getattr(fair, m))
                vals["accuracy"].append(100.0 * summary.accuracy)
            per[key] = {"run_ids": ids}
            for m, v in vals.items():
                mean, se, n = mean_se(v)
                per[key][m] = {"mean": mean, "se": se, "n": n}
        out[f"eps{eps:g}"] = per
        log(f"fairness runs at ε={eps:g} done")
    return out


def markdown(r: dict) -> str:
    lines = []
    for ds, per in r["audits"].items():
        for eps_key, a in per.items():
            groups = a["groups"]
            lines += [f"{ds}, ε = {eps_key[3:]}: PA-ALOOA, 2R = {a['n_models_per_algorithm']} models per algorithm, "
                      f"{a['threshold']} thresholds, {a['steps_per_model']} steps per model ({a['seconds']} s)", "",
                      "| algorithm | accuracy (%) | Δ (pp) [CI] | null Δ spread (pp) | resolved | "
                      + " | ".join(f"GPR {g} [CI] (own null floor)" for g in groups) + " |",
                      "|---|---|---|---|---|" + "---|" * len(groups)]
            for row in a["algorithms"].values():
                d, nd = row["delta_pp"], row.get("null_delta_pp")
                spread = "—" if not nd else f"[{_n(nd['low'], 2)}, {_n(nd['high'], 2)}]"
                res = {True: "yes", False: "no"}.get(row.get("resolved"), "—")
                lines.append(f"| {row['label']} | {_n(row['accuracy'], 2)} | {_n(d['value'], 2)} [{_n(d['low'], 2)}, "
                             f"{_n(d['high'], 2)}] | {spread} | {res} | " +
                             " | ".join(_gpr(row["gpr"].get(g), row.get("null_groups", {}).get(g)) for g in groups) + " |")
            lines.append("")
    t = r["tiered"]
    lines += [f"Tiered MNIST-10k (class tiers), 2R = {t['n_models_per_algorithm']}: GPR per tier [CI]", "",
              "| algorithm | accuracy (%) | Δ (pp) [CI] | null Δ spread (pp) | resolved | " + " | ".join(
                  f"{x['tier']} (own null floor)" for x in next(iter(t["algorithms"].values()))["gpr_by_tier"]) + " |",
              "|---|---|---|---|---|" + "---|" * len(next(iter(t["algorithms"].values()))["gpr_by_tier"])]
    for row in t["algorithms"].values():
        d, nd = row["delta_pp"], row.get("null_delta_pp")
        spread = "—" if not nd else f"[{_n(nd['low'], 2)}, {_n(nd['high'], 2)}]"
        lines.append(f"| {row['label']} | {_n(row['accuracy'], 2)} | {_n(d['value'], 2)} [{_n(d['low'], 2)}, "
                     f"{_n(d['high'], 2)}] | {spread} | {({True: 'yes', False: 'no'}).get(row.get('resolved'), '—')} | "
                     + " | ".join(_gpr(x, row.get("null_groups", {}).get(x["tier"])) for x in row["gpr_by_tier"]) + " |")
    f = r["fairness"]
    lines += ["", f"Outcome fairness on Adult (sex), mean ± s.e. over n = {len(f['seeds'])} seeds", "",
              "| ε | algorithm | accuracy (%) | demographic parity diff. | equalized odds diff. |", "|---|---|---|---|---|"]
    for eps_key, per in f.items():
        if eps_key == "seeds":
            continue
        for key, v in per.items():
            lines.append(f"| {eps_key[3:]} | {key} | {pm(v['accuracy']['mean'], v['accuracy']['se'])} | "
                         f"{pm(v['demographic_parity_difference']['mean'], v['demographic_parity_difference']['se'], 3)} | "
                         f"{pm(v['equalized_odds_difference']['mean'], v['equalized_odds_difference']['se'], 3)} |")
    return "\n".join(lines) + "\n"


def _n(x, d):
    return "—" if x is None else f"{x:.{d}f}"


def _gpr(e, floor=None) -> str:
    if not e or e.get("value") is None:
        return "—"
    return f"{e['value']:.4f} [{_n(e['low'], 4)}, {_n(e['high'], 4)}]" + ("" if floor is None else f" ({floor:+.4f})")


def export_figures(out: Path, prefix: str, reports: dict, result: dict) -> list:
    import pandas as pd

    paths = []
    for key, rep in reports.items():
        paths.append(common.export_png(fig_gpr_bars(rep.to_dict()), out / f"{prefix}_gpr_{key.replace('/', '_')}.png",
                                       width=900, height=500))
    # the Results page's talk figure, from the tiered audit's own report: GPR per tier vs its ε (CI, null floor,
    # the advantage (ε, δ)-DP allows) and the audit's empirical ε lower bound
    paths.append(common.export_png(fig_audit_tiers(audit_tier_frame(reports["tiered"])),
                                   out / f"{prefix}_tiered_gpr_vs_epsilon.png", width=1200, height=500))
    fair_rows, i = [], 0
    for eps_key, per in result["fairness"].items():
        if eps_key == "seeds":
            continue
        for key, v in per.items():
            i += 1
            for m in ("demographic_parity_difference", "equalized_odds_difference"):
                fair_rows.append({"run_id": i, "run": f"{key} ε={eps_key[3:]}", "algorithm": key, "metric": m,
                                  "value": v[m]["mean"]})
    fair = pd.DataFrame(fair_rows, columns=["run_id", "run", "algorithm", "metric", "value"])
    paths.append(common.export_png(fig_fairness_bars(fair, title="Outcome fairness on Adult (mean over seeds)"),
                                   out / f"{prefix}_fairness.png"))
    return paths


def main(argv=None) -> None:
    common.main(NAME, __doc__, run_experiment, argv)


if __name__ == "__main__":
    main()
