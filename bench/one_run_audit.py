"""The one-run audit (issue 19) on the MNIST paper tiers: per-tier ε̂ next to the claimed ε, the bug detector,
the cost against a plain run, and the tightness of the white-box bound.

    python bench/one_run_audit.py --json        # one JSON line; about 10 minutes alone on 2 cores

* ``tiers``: IDP-SGD (SAMPLE), Papernot CNN, tiers ε 1/2/3 by class, white-box: [{"tier", "epsilon",
  "epsilon_hat", "epsilon_hat_fdp"}] (``--canaries`` per tier, the likelihood-ratio score, confidence 1 − β; ε̂ by
  Steinke et al.'s bound and, from the same guesses, by the f-DP bound: ``engine.audit.one_run.fdp``);
* ``broken_detected``: the same run with the ε = 1 tier's noise divided by 4 (its clip × 4 under the same
  noise, unaccounted: ``engine.audit.one_run.run.Fault``) — true when that tier's ε̂ exceeds its claimed 1.0
  (``broken_detected_by``: by each bound);
  ``broken_rate_x4`` / ``broken_rate_x4_detected``: the same for its sampling rate × 4;
* ``seconds`` (the IDP-SGD one-run audit) and ``overhead_vs_plain_run`` (its seconds over a plain
  ``engine.train.loop.train`` of the same config, timed in this process just before and just after it: the
  quicker of the two);
* ``tightness``: DP-SGD with one tier at ε ∈ {1, 2, 4, 8}, ``--tight-canaries`` white-box canaries: ε̂, ε̂/ε, and
  ``gaussian_ceiling``: the mean ε̂ this estimator reaches at the same m on the Gaussian mechanism that is exactly
  (ε, δ)-DP (``engine.audit.one_run.bound.expected_gaussian_bound``), and ``mechanism_ceiling``: the mean ε̂ on
  the subsampled Gaussian mechanism this run composes (its q, σ and T; ``expected_subsampled_bound``): what a
  perfect white-box attack on this run could show. Each again by the f-DP bound (``epsilon_hat_fdp``,
  ``ratio_fdp``, ``gaussian_ceiling_fdp``, ``mechanism_ceiling_fdp``: the same scores, the same seeds).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datadir import use_shared_data  # noqa: E402

from engine.audit.one_run.run import Fault, design_canaries, run_one_algorithm  # noqa: E402
from engine.audit.one_run.bound import expected_gaussian_bound, expected_subsampled_bound  # noqa: E402
from engine.audit.one_run.fdp import expected_gaussian_bound_fdp, expected_subsampled_bound_fdp  # noqa: E402
from engine.audit.one_run.config import OneRunConfig  # noqa: E402
from engine.config.run import AlgorithmConfig, TierConfig, TiersConfig  # noqa: E402
from engine.train.loop import prepare, train  # noqa: E402

PAPER = {"data": {"name": "mnist"}, "model": {"name": "cnn"}, "batch_size": 512, "clip_norm": 1.0,
         "optimizer": {"name": "sgd", "lr": 0.5, "momentum": 0.5}, "delta": 1e-5}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=float, default=4.0)
    ap.add_argument("--canaries", type=int, default=1000, help="white-box canaries per tier")
    ap.add_argument("--tight-canaries", dest="tight", type=int, default=5000)
    ap.add_argument("--tight-epsilons", dest="tight_eps", type=float, nargs="*", default=[1.0, 2.0, 4.0, 8.0])
    ap.add_argument("--max-train", dest="max_train", type=int, default=None)
    ap.add_argument("--canary-slots", dest="slots", choices=("spare", "model"), default="spare",
                    help="the gradient canaries' coordinates: spare slots (default) or the model's own")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    use_shared_data()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    run = {**PAPER, "epochs": args.epochs, "data": {"name": "mnist", "max_train": args.max_train}}
    cfg = OneRunConfig.from_dict({"run": run, "canaries": args.canaries, "input_canaries": 0,
                                  "canary_slots": args.slots, "algorithms": ["idp_sample"]}).validate()
    algo = AlgorithmConfig(name="idp_sample")
    prep = prepare(cfg.run_for(algo))
    can = design_canaries(cfg, prep)

    def plain_run():  # the same config without canaries: one evaluation at the start and one at the end
        t = time.perf_counter()
        train(cfg.run_for(algo).replace(eval_every=10**6))
        return time.perf_counter() - t

    first = plain_run()
    t = time.perf_counter()
    sound, _, _ = run_one_algorithm(cfg, algo, "idp_sample", can)
    seconds = time.perf_counter() - t
    plain = min(first, plain_run())  # before and after: the quieter of the two
    broken, _, _ = run_one_algorithm(cfg, algo, "idp_sample", can, fault=Fault(tier=0, sensitivity_factor=4.0))
    rate, _, _ = run_one_algorithm(cfg, algo, "idp_sample", can, fault=Fault(tier=0, rate_factor=4.0))

    tight = []
    for eps in args.tight_eps:
        one = TiersConfig(assign="class", tiers=(TierConfig(epsilon=eps, classes=tuple(range(10)), name=f"ε={eps:g}"),))
        tcfg = OneRunConfig.from_dict({"run": {**run, "tiers": json.loads(json.dumps(_tiers_dict(one)))},
                                       "canaries": args.tight, "input_canaries": 0, "canary_slots": args.slots,
                                       "algorithms": ["dpsgd"]}).validate()
        tprep = prepare(tcfg.run_for(AlgorithmConfig(name="dpsgd")))
        got, _, _ = run_one_algorithm(tcfg, AlgorithmConfig(name="dpsgd"), "dpsgd", prep=tprep)
        t0 = got.tiers[0]
        b, f, eps = t0.white, t0.white_fdp, t0.epsilon
        plan = tprep.privacy.plan
        mech = (float(plan.sample_rates[0]), float(plan.noise_multiplier), got.steps, b.m)
        tight.append({"epsilon": eps, "epsilon_hat": b.epsilon_hat, "ratio": b.epsilon_hat / eps,
                      "epsilon_hat_fdp": f.epsilon_hat, "ratio_fdp": f.epsilon_hat / eps, "canaries": b.m,
                      "gaussian_ceiling": expected_gaussian_bound(eps, run["delta"], b.m, trials=10),
                      "gaussian_ceiling_fdp": expected_gaussian_bound_fdp(eps, run["delta"], b.m, trials=10),
                      "mechanism_ceiling": expected_subsampled_bound(*mech, delta=run["delta"], beta=cfg.beta,
                                                                     trials=10),
                      "mechanism_ceiling_fdp": expected_subsampled_bound_fdp(*mech, delta=run["delta"],
                                                                             beta=cfg.beta, trials=10)})

    def rows(r):
        return [{"tier": x.tier, "epsilon": x.epsilon, "epsilon_hat": x.white.epsilon_hat,
                 "epsilon_hat_fdp": x.white_fdp.epsilon_hat} for x in r.tiers]

    def caught(r):
        return {m: bool(r.tiers[0].bound("white", m).epsilon_hat > r.tiers[0].epsilon) for m in ("steinke", "fdp")}

    out = {"tiers": rows(sound), "broken_detected": bool(broken.tiers[0].white.epsilon_hat > broken.tiers[0].epsilon),
           "broken_detected_by": caught(broken), "broken_rate_x4_detected_by": caught(rate),
           "broken_tiers": rows(broken), "broken_rate_x4": rows(rate),
           "broken_rate_x4_detected": bool(rate.tiers[0].white.epsilon_hat > rate.tiers[0].epsilon),
           "seconds": seconds, "plain_seconds": plain, "overhead_vs_plain_run": seconds / plain,
           "accuracy": sound.accuracy, "steps": sound.steps, "canaries_per_tier": args.canaries,
           "beta": cfg.beta, "score": cfg.white_score, "canary_slots": args.slots, "epochs": args.epochs, "tightness": tight}
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return
    for k, v in out.items():
        print(f"{k}: {v}")


def _tiers_dict(tiers: TiersConfig) -> dict:
    return {"assign": tiers.assign, "tiers": [{"epsilon": t.epsilon, "classes": list(t.classes), "name": t.name}
                                              for t in tiers.tiers]}


if __name__ == "__main__":
    main()
