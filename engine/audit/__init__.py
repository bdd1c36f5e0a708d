"""The audits, one package each (they import nothing of each other; tests/test_layers.py checks it):

  pa_alooa/   PA-ALOOA: 2R models on complementary halves, per-sample membership advantage, group privacy risk and
              Δ against a null floor, the baselines, LiRA, empirical ε; DP-SGD-S's controls (engine.audit.pa_alooa)
  one_run/    the one-run audit (per-tier empirical ε from one training run per algorithm: Steinke et al. 2023's
              bound and the f-DP bound of Mahloujifar et al. 2025)
              (engine.audit.one_run)

What both need of a job that trains one RunConfig per algorithm is engine.config.job.

Layer 7 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli:
may import engine.train, engine.dp and everything below them.
"""
