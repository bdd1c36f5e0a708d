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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import common  # noqa: E402
from experiments.common import ConfigError, finite  # noqa: E402
from engine.audit.one_run.config import OneRunConfig  # noqa: E402
from engine.audit.pa_alooa.config import AuditConfig  # noqa: E402
from engine.figures.experiments import COLLUSION_COLUMNS, collusion_sentence, fig_collusion  # noqa: E402
from engine.jobs.kinds import execute  # noqa: E402
from engine.train.loop import preview  # noqa: E402

NAME = "collusion"


def tiers_of(spec: dict, setting: dict) -> dict:
    """The tiers of one setting: the fixed tier, then each other tier at the setting's budget."""
    others = spec["other_tiers"]
    eps = setting.get("epsilons")
    if not isinstance(eps, list) or len(eps) != len(others):
        raise ConfigError("settings", f"setting {setting.get('name')!r} needs one ε per other tier ({len(others)})")
    tiers = [dict(spec["fixed_tier"])]
    tiers += [{"classes": t["classes"], "epsilon": float(e), "name": f"{t['name']} at ε={e:g}"}
              for t, e in zip(others, eps)]
    return {"assign": "class", "tiers": tiers}


def configs(spec: dict, mode: dict, setting: dict, *, device=None, threads=None) -> tuple[OneRunConfig, AuditConfig]:
    run_extra = {f"run.{k}": v for k, v in (("device", device), ("threads", threads)) if v is not None}
    tiers = {"run.tiers": tiers_of(spec, setting), **run_extra}
    one = common.with_overrides(common.with_overrides(spec["one_run"], mode.get("one_run", {})), tiers)
    audit = common.with_overrides(common.with_overrides(spec["audit"], mode.get("audit", {})), tiers)
    return OneRunConfig.from_dict(one).validate(), AuditConfig.from_dict(audit).validate()


def run_experiment(args) -> tuple[dict, str]:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = common.load_spec_sections(args.config, ("fixed_tier", "audit", "one_run", "modes"))
    mode, _ = common.mode_of(spec, args.mode)
    store = common.open_store(common.store_path(args, NAME))
    started = time.time()
    fixed = spec["fixed_tier"]["name"]
    rows = []
    for setting in spec.get("settings") or []:
        one_cfg, audit_cfg = configs(spec, mode, setting, device=args.device, threads=args.threads)
        label = setting["name"]
        plan = preview(one_cfg.run_for(one_cfg.algorithms[0]))  # the plan the one-run audit trains with
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
