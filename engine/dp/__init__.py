"""Differential privacy: everything between a config and one private step.

    algorithms.py   the algorithm registry: one ``Algorithm`` per algorithm (its spec's facts from
                    engine.config.algorithms — label, colour, planner mode, formal-DP rule, gain partner, controls
                    — plus its mechanism factory and set-up); nothing else branches on an algorithm's name
    accounting.py   ``plan()`` (DP-SGD / IDP-SGD SCALE / SAMPLE) under the run's accountant, the live accountant,
                    ``plan_errors`` (planning failures → ConfigError)
    accountants.py  one interface over RDP, PRV and PLD: ε of a tier's (q, σ, T, δ) and the planner's two searches
    fast_rdp.py     Opacus' RDP formulas vectorised, a monotone root finder (the planner's search only)
    importance.py   INO-SGD's importance weights (``ino_weights``), ``bif``, the tail length γ
    mechanisms.py   the one mechanism family (C_i, ρ_i, noise, ``observe``), ``build_mechanism`` (calls the registry's)
    groups.py       the one grouping of samples (tier, class, attribute) and DP-SGD-S's set-up on it
    per_sample.py   what every per-sample path gives the step (``PerSampleGrads``); the strategies, "ghost" by default
    grad_sample.py  per-sample gradients of M models: the closed-form linear stack, one live module, vmap
    layerwise.py    the layerwise path: one rule per layer type, for one live module or M stacked models in one pass
    ghost.py        ghost norms / book-keeping for Linear and Conv2d (strategy "ghost")
    step.py         the one DP step (``dp_step``) and the Poisson sampler
    canaries.py     white-box gradient canaries as extra members of the step (the one-run audit)
    stacked.py      M models with stacked parameters (an audit chunk, a k-seed job)
    tiers.py        privacy tiers: by class, by attribute, random, explicit; presets
    prepare.py      everything fixed before step 1: data, tiers, steps, the privacy plan in the algorithm's planner
                    mode, its derived numbers and what the algorithm's entry fixes beyond it

Layer 5 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: may import engine.models, engine.store, engine.config and engine.data.
"""
