"""DP-SGD-S's controls, trained: each is planned once DP-SGD-S has trained (the controls come last among the
audit's algorithms), from what it realised: the noise-matched control from its realised noise multiplier, the
accuracy-matched one from an ε search on the pilot models (``plan.search_accuracy_match``), kept as an
artifact so that a resumed audit trains the same control. The runner then trains and scores a control's 2R
models like any algorithm's.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from engine.audit.pa_alooa.analysis import correct_predictions
from engine.audit.pa_alooa.controls import plan
from engine.audit.pa_alooa.design import chunks, derived_seed, init_seeds
from engine.audit.pa_alooa.executor import train_chunk
from engine.audit.pa_alooa.setup import AlgoSetup, AuditSetup
from engine.config.schema import ConfigError
from engine.dp import accounting
from engine.dp.prepare import PrivacyPlan, prepare_privacy


def resolve_control(setup: AuditSetup, a: AlgoSetup, results: dict, ckpt, should_stop) -> AlgoSetup:
    """Plan the control ``a`` from what DP-SGD-S (already trained: the controls come last) realised."""
    s = next(x for x in setup.algos if x.algo.name == plan.CONTROLLED.name and x.control is None)
    dpsgd = next(x for x in setup.algos if x.algo.name == plan.ALGORITHM.name and x.control is None)
    if a.control == "noise_matched":
        realised = results[s.key].realised_noise
        privacy, info = plan.noise_matched(dpsgd.privacy, float(np.mean(realised)) if realised is not None
                                               else math.nan, of=s.key)
    else:
        privacy, info = accuracy_match(setup, s, dpsgd, results, ckpt, should_stop)
    return dataclasses.replace(a, privacy=privacy, claimed=[float(e) for e in privacy.plan.epsilons], resolved=True,
                               control_info=info)


def dpsgd_at(setup: AuditSetup, epsilon: float) -> PrivacyPlan:
    """DP-SGD's privacy preparation with every tier at ``epsilon`` (the accuracy-matched control's candidates)."""
    rc = setup.config.run_for(plan.ALGORITHM, plan.tiers_at(setup.tiers_config, epsilon))
    try:
        return prepare_privacy(rc, setup.data, steps=setup.steps, tier_sizes=setup.half_tier_sizes, field="controls")
    except ConfigError as e:
        raise ConfigError("controls", f"accuracy-matched DP-SGD at ε = {epsilon:.4g}: {e.message}") from None


def accuracy_match(setup: AuditSetup, s: AlgoSetup, dpsgd: AlgoSetup, results: dict, ckpt, should_stop):
    """The accuracy-matched control: the ε search on the pilot models (``plan.search_accuracy_match``),
    kept as an artifact so that a resumed audit trains the same control."""
    cfg = setup.config
    pilot = plan.pilot_models(setup.n_models)
    target = float(results[s.key].accuracy[:pilot].mean())
    eps0 = float(min(dpsgd.privacy.plan.target_epsilons))
    seeds = init_seeds(cfg.run.seed, 0, pilot)  # the audit's first models' initialisations

    def accuracy_at(epsilon: float) -> float:
        candidate = dataclasses.replace(dpsgd, privacy=dpsgd_at(setup, epsilon))
        preds = []
        for c, (lo, hi) in enumerate(chunks(pilot, setup.chunk_models)):  # within the audit's memory budget
            gen_seed = derived_seed(cfg.run.seed, 5) if c == 0 else derived_seed(cfg.run.seed, 5, c)
            _, _, pred, _ = train_chunk(setup, candidate, setup.membership[lo:hi], seeds[lo:hi], gen_seed, None,
                                         should_stop)
            preds.append(pred)
        return float(correct_predictions(setup, np.concatenate(preds)).mean())

    saved = ckpt.get_json("control/accuracy_matched/search")
    if saved is None:
        eps, trace, matched = plan.search_accuracy_match(
            accuracy_at, target, eps0, floor=2 * accounting.epsilon_floor(cfg.run.delta))
        ckpt.put_json("control/accuracy_matched/search", {"epsilon": eps, "trace": trace, "matched": matched})
    else:
        eps, trace, matched = saved["epsilon"], saved["trace"], saved["matched"]
    privacy = dpsgd_at(setup, eps)
    return privacy, plan.accuracy_matched_info(privacy, of=s.key, target_epsilon=eps0, target_accuracy=target,
                                                   trace=trace, matched=matched, pilot=pilot)
