"""PA-ALOOA: the privacy audit over 2R models trained on complementary halves (per-sample membership
advantage, group privacy risk and Δ against a null floor, the baselines, LiRA, empirical ε), and DP-SGD-S's controls.

  config.py    AuditConfig: the RunConfig its models train with (``run``) plus the audit's own fields
  design.py    membership design: the complementary halves (R pairs, handed to the statistics as ``pairs``),
               groups, PA-LOOA targets, seeds, chunk layout
  setup.py     everything fixed before the first model: data, groups, membership, per-algorithm plans, chunk size;
               the preview before launch
  runner.py    chunk training, checkpoints / resume, progress, PA-LOOA, ``python -m engine audit``
  executor.py  train_chunk (one chunk of stacked models) and the local chunk executor (engine.jobs.ray_backend: Ray's)
  analysis.py  the report computed from the models' scores and the membership
  report.py    AuditReport / AlgorithmReport (typed, to_dict / from_dict)
  records.py   their parts: Estimate, TierEpsilon, Baselines, ControlInfo, PairedComparison, … (typed the same way)
  summary.py   the report as CLI text: the table, ``--json``'s headline numbers, the verdict under them
  controls/    DP-SGD-S's noise-matched and accuracy-matched DP-SGD controls: plan.py (their plans, the accuracy
               search), runs.py (each resolved once DP-SGD-S has trained), compare.py (paired comparisons on the
               shared splits: paired bootstrap, paired accuracy)
  verdict.py   the answer in words: DP-SGD-S vs DP-SGD and its controls, levelling up per group
  frames.py    the report's tidy pandas frames (what the figures draw)
  stats/       the statistics themselves, by concern: inputs (checked inputs, the models' halves), thresholds
               (the sorted searches), advantage (per-sample advantage, GPR, bootstrap, null floor / null Δ),
               baselines (PA-GA/GBA/LOOA, LiRA, ROC), epsilon
  presets.py   named audits (quick, quick-eps1, adult-paper, mnist-paper)
  estimate.py  the runtime estimate before launch (model-steps × a measured per-model-step cost)
  chunks.py    how many models train at once (a chunk's step working set against the memory budget)
  parallel.py  the statistics' thread pool (every number the same on any number of threads)

It imports nothing of the one-run audit (engine.audit.one_run; tests/test_layers.py checks it).
"""
