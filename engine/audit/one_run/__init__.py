"""The one-run audit: per-tier empirical ε from one training run per algorithm (Steinke et al. 2023; the f-DP
reading of the same guesses, Mahloujifar et al. 2025).

    config.py  OneRunConfig: the RunConfig its runs train with, canaries per tier, β, the white-box score
    run.py     canaries (white-box gradient, black-box input) as members of their tier; one run each; the preview
    bound.py   the ε lower bound from guesses (with δ; Bonferroni over a fixed guess grid); Gaussian truth
    fdp.py     the f-DP lower bound from the same guesses (the claim's trade-off curve); its ceilings
    report.py  OneRunReport (typed, to_dict / from_dict), its tidy frame, its verdict in words, the CLI table

It imports nothing of PA-ALOOA's modules (engine.audit.pa_alooa.config, runner, stats, …): what both audits share about a
job that trains one RunConfig per algorithm is engine.config.job (tests/test_layers.py checks it).
"""
