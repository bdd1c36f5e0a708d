"""DP-SGD-S's controls: what DP-SGD would do with DP-SGD-S's noise, and at DP-SGD-S's accuracy.

DP-SGD-S adds noise z_Δ · max_k C_k (a formal guarantee needs the largest clip), so it is partly DP-SGD with
more noise. Whether its group-specific clipping lowers Δ beyond what that extra noise alone does is what
these two DP-SGD runs, audited on the same splits as DP-SGD-S (so every comparison is paired), answer:

* **noise-matched**: DP-SGD at z = z_Δ · mean over steps and models of max_k C_k / C — the multiplier DP-SGD-S
  realised in this audit (``GroupAdaptive.realised_noise_multiplier``, kept in its chunk checkpoints) —, with
  the ε the accountant gives that z (``accounting.plan_at_noise``): below the audit's target, since z > σ.
* **accuracy-matched**: DP-SGD at the ε where its mean test accuracy equals DP-SGD-S's. The search
  (:func:`search_accuracy_match`) is a bisection in log ε on ``PILOT_MODELS`` models (the audit's first
  memberships and initialisations, one batch/noise stream for every ε tried, so accuracy(ε) is smooth),
  against DP-SGD-S's accuracy on the same models; then the control's 2R models train at the found ε.

    plan.py     the two controls' plans (the noise-matched plan, the accuracy search), their names and labels
    runs.py     each control resolved once DP-SGD-S has trained: its search's pilot models, kept for a resume
    compare.py  the paired comparisons: DP-SGD-S against DP-SGD and against each control, paired bootstrap CIs

The runner (``engine.audit.pa_alooa.runner``) trains and scores the controls' 2R models like any algorithm's.
"""