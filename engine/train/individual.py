"""Individual ε in a training run: what the loop holds (a panel tracker, :mod:`engine.dp.individual_panel`) and the
per-group summaries an evaluation stores (``EvalRecord.individual_epsilon``; the last one is the run summary's).

    run_tracker(prep)                 the run's PanelTracker, None when there is nothing to account (no formal DP
                                      guarantee) or the config opts out (``RunConfig.individual_epsilon = false``)
    groupings(prep)                   the groupings a train run reports: by class, by tier, and by the dataset's
                                      sensitive attribute where it has one
    summaries(tracker, prep, step, j) {grouping: IndividualEpsilonSummary} of model j after ``step`` steps

The panel is drawn per class, or per class × attribute cell where the dataset has a sensitive attribute, so that
each minority cell gets its own panel samples (up to ``PANEL_PER_GROUP``) and every grouping's summary has them.
"""
from __future__ import annotations

import numpy as np

from engine.dp.individual_panel import PanelTracker

#: the groupings' names, in the order they are stored and shown
BY_CLASS, BY_TIER = "class", "tier"


def _attribute(prep):
    """(name, values (n_train,) as str) of the dataset's default sensitive attribute, or None."""
    ds = prep.dataset
    attr = ds.default_sensitive
    if attr is None or attr not in ds.sensitive_train:
        return None
    return attr, np.asarray(ds.sensitive_train[attr]).astype(str)


def groupings(prep) -> dict:
    """{grouping: (group index per training sample, group names)}: class, tier, and the sensitive attribute."""
    ds = prep.dataset
    out = {BY_CLASS: (ds.y_train.cpu().numpy(), list(ds.class_names)),
           BY_TIER: (np.asarray(prep.tiers.train), list(prep.tiers.names))}
    attr = _attribute(prep)
    if attr is not None:
        name, values = attr
        names, index = np.unique(values, return_inverse=True)
        out[name] = (index, [str(v) for v in names])
    return out


def _panel_groups(prep) -> np.ndarray:
    """The labels the panel is drawn per: the class, or the class × attribute cell."""
    y = prep.dataset.y_train.cpu().numpy().astype(np.int64)
    attr = _attribute(prep)
    if attr is None:
        return y
    _, index = np.unique(attr[1], return_inverse=True)
    return y * (int(index.max()) + 1) + index


def run_tracker(prep) -> PanelTracker | None:
    """The run's tracker (None: opted out, or no formal DP guarantee: nothing to account)."""
    config = prep.config
    if not config.individual_epsilon:
        return None
    return PanelTracker.for_run(privacy=prep.privacy, sample_tiers=prep.tiers.train, panel_groups=_panel_groups(prep),
                                delta=config.delta, seed=config.seed, steps=prep.steps, n_models=prep.n_models)


def summaries(tracker: PanelTracker, prep, step: int, model: int, groups: dict | None = None) -> dict:
    """{grouping: IndividualEpsilonSummary} of model ``model`` after ``step`` steps (``groups``: :func:`groupings`)."""
    groups = groupings(prep) if groups is None else groups
    return {name: tracker.summary(step, index, names, model=model) for name, (index, names) in groups.items()}
