"""Does my tier's risk depend on the others' budgets? The collusion test (Kaiser et al., SaTML 2026: under
sampling-based individualized DP one person's risk depends on the other people's budgets, every formal ε holding).

    python experiments/collusion.py --quick --json     4 settings, 2R = 100 LR models and one CNN run each (~10 min)
    python experiments/collusion.py --full             2R = 400 per setting, the one-run CNN for 4 epochs
    python experiments/collusion.py --smoke            digits, seconds (the tests)

The MNIST paper tiers under IDP-SGD SAMPLE: the ε = 1 tier (digits 2, 5, 9) is fixed, the other two tiers' budgets
change from setting to setting (``collusion.json``'s ``settings``). Per setting the fixed tier's rate q and the
run's σ in each of the two runs (what its ε = 1 is made of: the shared σ falls as the others' budgets grow, and the
planner lowers the fixed tier's rate to keep its ε), its
empirical risk from the one-run audit (white-box gradient canaries in spare slots; ε̂ by Steinke et al.'s bound and
by the f-DP bound, ``engine.audit.one_run``) and its PA-ALOOA GPR with CI and null floor (``engine.audit.pa_alooa``,
GPR by tier). The figure and the sentence are ``engine.figures.experiments.fig_collusion`` /
``collusion_sentence``.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common  # noqa: E402
from experiments.common import ConfigError, finite  # noqa: E402
from engine.audit.one_run.config import OneRunConfig  # noqa: E402
from engine.audit.pa_alooa.config import AuditConfig  # noqa: E402
from engine.config.job import algorithms_advisories  # noqa: E402
from engine.config.run import MAX_CLASS_ID, MAX_NAME_CHARS, MAX_TIERS, TierConfig  # noqa: E402
from engine.config.schema import check_int, check_list, check_positive, check_str, parse_section  # noqa: E402
from engine.figures.experiments import COLLUSION_COLUMNS, collusion_sentence, fig_collusion  # noqa: E402
from engine.jobs.kinds import execute  # noqa: E402
from engine.train.loop import preview  # noqa: E402

NAME = "collusion"
MAX_SETTINGS = 1000


@dataclass(frozen=True)
class OtherTier:
    """A tier whose budget the settings vary (``other_tiers[k]``)."""

    classes: tuple[int, ...]
    name: str


@dataclass(frozen=True)
class Setting:
    """One setting: its name and one ε per other tier (``settings[k]``)."""

    name: str
    epsilons: tuple[float, ...]


MODE_SECTIONS = ("one_run", "audit")  # what a mode of this spec overrides (dotted keys of each section)


def check_spec(spec: dict) -> dict:
    """The study's own sections checked whole with the engine's typed checks, before anything trains: the fixed tier
    (a tier with its ε, classes and name), the other tiers (classes and name each), the settings (a name and one
    finite ε > 0 per other tier each). One ConfigError naming the field (``settings[2].epsilons[0]``) otherwise."""
    if "name" not in spec["fixed_tier"]:
        raise ConfigError("fixed_tier.name", "is required (the study follows this tier by its name)")
    fixed = parse_section(TierConfig, spec["fixed_tier"], "fixed_tier.")
    fixed.validate("fixed_tier.")
    check_str(fixed.name, "fixed_tier.name", nonempty=True)
    check_list(fixed.classes, "fixed_tier.classes", nonempty=True)
    others = check_list(spec.get("other_tiers"), "other_tiers", max_len=MAX_TIERS - 1, nonempty=True)
    for k, raw in enumerate(others):
        tier = parse_section(OtherTier, raw, f"other_tiers[{k}].")
        check_list(tier.classes, f"other_tiers[{k}].classes", nonempty=True)
        for j, c in enumerate(tier.classes):
            check_int(c, f"other_tiers[{k}].classes[{j}]", 0, MAX_CLASS_ID)
        check_str(tier.name, f"other_tiers[{k}].name", max_len=MAX_NAME_CHARS, nonempty=True)
    settings = check_list(spec.get("settings"), "settings", max_len=MAX_SETTINGS, nonempty=True)
    for k, raw in enumerate(settings):
        setting = parse_section(Setting, raw, f"settings[{k}].")
        check_str(setting.name, f"settings[{k}].name", max_len=MAX_NAME_CHARS, nonempty=True)
        if len(setting.epsilons) != len(others):
            raise ConfigError(f"settings[{k}].epsilons", f"needs one ε per other tier ({len(others)}), "
                                                         f"got {len(setting.epsilons)}")
        for j, e in enumerate(setting.epsilons):
            check_positive(e, f"settings[{k}].epsilons[{j}]")
    return spec


def tiers_of(spec: dict, setting: dict) -> dict:
    """The tiers of one (checked) setting: the fixed tier, then each other tier at the setting's budget."""
    tiers = [dict(spec["fixed_tier"])]
    tiers += [{"classes": t["classes"], "epsilon": float(e), "name": f"{t['name']} at ε={e:g}"}
              for t, e in zip(spec["other_tiers"], setting["epsilons"])]
    return {"assign": "class", "tiers": tiers}


def configs(spec: dict, mode: dict, setting: dict, *, device=None, threads=None) -> tuple[OneRunConfig, AuditConfig]:
    """The validated one-run and audit configs of one setting; a ConfigError names the section (``audit.R``)."""
    run_extra = {f"run.{k}": v for k, v in (("device", device), ("threads", threads)) if v is not None}
    tiers = {"run.tiers": tiers_of(spec, setting), **run_extra}
    out = []
    for section, cls in (("one_run", OneRunConfig), ("audit", AuditConfig)):
        d = common.with_overrides(common.with_overrides(spec[section], mode.get(section, {})), tiers)
        try:
            out.append(cls.from_dict(d).validate())
        except ConfigError as e:
            raise e.under(f"{section}.") from None
        config = out[-1]
        common.warn([e.under(f"{section}.") for e in config.run.advisories() + algorithms_advisories(config.algorithms)])
    return out[0], out[1]


def planned_configs(spec: dict, mode_name: str, *, device=None, threads=None) -> list[tuple[str, OneRunConfig,
                                                                                            AuditConfig]]:
    """(setting name, one-run config, audit config) of every setting of the (checked) spec in ``mode_name``: all
    built and validated before the first one trains."""
    mode, _ = common.mode_of(spec, mode_name)
    for key, value in mode.items():
        if key not in MODE_SECTIONS:
            raise ConfigError(f"modes.{mode_name}.{key}", f"unknown field; allowed: {', '.join(MODE_SECTIONS)}")
        if not isinstance(value, dict):
            raise ConfigError(f"modes.{mode_name}.{key}", "must be a JSON object of dotted overrides")
    return [(s["name"], *configs(spec, mode, s, device=device, threads=threads)) for s in spec["settings"]]


def run_experiment(args) -> tuple[dict, str]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = check_spec(common.load_spec_sections(args.config, ("fixed_tier", "audit", "one_run", "modes")))
    planned = planned_configs(spec, args.mode, device=args.device, threads=args.threads)
    fixed = spec["fixed_tier"]["name"]
    # the plan each one-run audit trains with, also before anything trains (a dataset that cannot load stops here)
    plans = [preview(one_cfg.run_for(one_cfg.algorithms[0])) for _, one_cfg, _ in planned]
    store = common.open_store(common.store_path(args, NAME))
    started = time.time()
    rows = []
    for (label, one_cfg, audit_cfg), setting, plan in zip(planned, spec["settings"], plans):
        k = list(plan.tier_names).index(fixed)
        rid = store.create_run(one_cfg.to_dict(), kind="one_run", status="queued", name=f"{NAME} {label} one-run")
        one = execute(store, rid, one_cfg, kind="one_run", backend=args.backend)
        aid = store.create_run(audit_cfg.to_dict(), kind="audit", status="queued", name=f"{NAME} {label} audit")
        audit = execute(store, aid, audit_cfg, kind="audit", backend=args.backend)
        tier = next(t for t in one.algorithms[0].tiers if t.tier == fixed)
        a = audit.algorithms[0]
        g = a.gpr[fixed]
        audit_plan = next(p for p in a.plan if p["tier"] == fixed)  # the audit's own plan (its n, batch and steps)
        rows.append({"setting": label, "others": ", ".join(f"{e:g}" for e in setting["epsilons"]), "tier": fixed,
                     "epsilon": finite(tier.epsilon), "sample_rate": finite(plan.sample_rates[k]),
                     "noise_multiplier": finite(plan.noise_multiplier), "epsilon_hat": finite(tier.white.epsilon_hat),
                     "epsilon_hat_fdp": finite(tier.white_fdp.epsilon_hat), "gpr": finite(g.value),
                     "gpr_low": finite(g.low), "gpr_high": finite(g.high),
                     "null_floor": finite(a.null_groups.get(fixed, a.null_floor)),
                     "accuracy": finite(one.algorithms[0].accuracy), "audit_accuracy": finite(a.accuracy.mean),
                     "audit_sample_rate": finite(audit_plan["sample_rate"]),
                     "audit_noise_multiplier": finite(audit_plan["noise_multiplier"]), "canaries": tier.white.m, "n_models": audit_cfg.n_models, "one_run_id": rid, "audit_id": aid})
        sys.stderr.write(f"[{time.time() - started:7.1f}s] {label}: ε̂ {tier.white.epsilon_hat:.3f} "
                         f"(f-DP {tier.white_fdp.epsilon_hat:.3f}), GPR {g.value:.4f}\n")
    import pandas as pd

    frame = pd.DataFrame(rows, columns=COLLUSION_COLUMNS)
    result = {"mode": args.mode, "rows": rows, "sentence": collusion_sentence(frame), "store": str(store.path),
              "wall_seconds": round(time.time() - started, 1)}
    out = common.figures_dir(args, NAME)
    if out is not None:
        path = common.export_png(fig_collusion(frame), out / f"{NAME}_{args.mode}.png", width=1100, height=480)
        result["figures"] = [str(path)] if path else []
    return result, markdown(result)


def markdown(r: dict) -> str:
    lines = [r["sentence"], "",
             "| the others' ε | one-run q, σ | ε̂ Steinke | ε̂ f-DP | audit q, σ | GPR [CI] | null floor | "
             "accuracy (one-run) | accuracy (audit) |", "|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['setting']} ({row['others']}) | {row['sample_rate']:.3g}, {row['noise_multiplier']:.3f} | "
                     f"{row['epsilon_hat']:.3f} | {row['epsilon_hat_fdp']:.3f} | "
                     f"{row['audit_sample_rate']:.3g}, {row['audit_noise_multiplier']:.3f} | {row['gpr']:.4f} "
                     f"[{row['gpr_low']:.4f}, {row['gpr_high']:.4f}] | {row['null_floor']:.4f} | "
                     f"{row['accuracy']:.3f} | {row['audit_accuracy']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    common.main(NAME, __doc__, run_experiment, argv)


if __name__ == "__main__":
    main()
