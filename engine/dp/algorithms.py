"""The algorithm registry: one :class:`Algorithm` per algorithm the lab trains, read by every layer above.

    ALGORITHM_REGISTRY / algorithm(name)   config name → Algorithm; ConfigError naming the known ones otherwise
    find_algorithm(name)                   the same, None for a name that is not registered (a stored run's "")
    draws(name, figure)                    whether runs of ``name`` draw the talk figure ``figure`` (its internals)
    GAIN_REFERENCES                        the algorithms some algorithm's gains are measured against (IDP-SGD)
    WITH_CONTROLS                          the algorithms an audit can add controls for (DP-SGD-S)

An :class:`Algorithm` is its plain facts (:class:`engine.config.algorithms.AlgorithmSpec`, owned by the
configuration layer so that validation, labels and the formal-DP rule need nothing from here: label, colour,
marker, planner mode, formal-DP rule, its fields' validation, gain partner, audit controls, grouping, own figures,
picker place) and what only this layer has: the mechanism factory :func:`engine.dp.mechanisms.build_mechanism`
calls, and what the privacy preparation (``engine.dp.prepare.prepare_privacy``) fixes before step 1 beyond the
plan (DP-SGD-S's clip groups and releases, INO-SGD's tail length γ).

Modelled on the job kinds (``engine.jobs.kinds``) and Opacus' accountant registry: what differs between
algorithms is a field here, never an ``if`` on a name elsewhere (tests/test_algorithm_registry.py), so adding one
is its spec, its entry, its mechanism and its tests.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from engine.config.algorithms import ALGORITHM_SPECS, AlgorithmSpec
from engine.config.schema import ConfigError
from engine.dp.dpsgd_f import ClippingBias, clipping_bias_setup
from engine.dp.global_adapt import GlobalScaling, global_scaling_setup
from engine.dp.groups import group_clip_setup
from engine.dp.importance import resolve_tail_length
from engine.dp.mechanisms import Clipped, GroupAdaptive, Importance, Mechanism, NonPrivate


@dataclass(frozen=True, kw_only=True)
class Algorithm(AlgorithmSpec):
    """One algorithm: its spec's facts, its mechanism and its set-up before step 1."""

    # (privacy, *, n_models, device, sample_tiers) → the step's mechanism for M models (build_mechanism calls it)
    mechanism: Callable[..., Mechanism]
    # (config, data, plan, *, tier_sizes, group_attribute, field) → (the plan it trains with, its set-up, kept as
    # PrivacyPlan.clip_setup): what it fixes beyond the planner's plan (DP-SGD-S: groups, released sizes, z_Δ, σ_b)
    setup: Callable | None = None
    # (algorithm config, expected batch clip mass Σ q_k C_k N_k) → its tail length γ, fixed once (INO-SGD)
    tail_length: Callable[[object, float], float] | None = None


def _entry(name: str, **dp) -> Algorithm:
    """The registry entry of ``name``: its spec's facts as they are, and the fields of this layer."""
    spec = ALGORITHM_SPECS[name]
    return Algorithm(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(AlgorithmSpec)}, **dp)


ALGORITHM_REGISTRY: dict[str, Algorithm] = {
    "nonprivate": _entry("nonprivate", mechanism=NonPrivate.from_privacy),
    "dpsgd": _entry("dpsgd", mechanism=Clipped.from_privacy),
    "idp_sample": _entry("idp_sample", mechanism=Clipped.from_privacy),
    "idp_scale": _entry("idp_scale", mechanism=Clipped.from_privacy),
    "ino": _entry("ino", mechanism=Importance.from_privacy, tail_length=resolve_tail_length),
    "dpsgd_s": _entry("dpsgd_s", mechanism=GroupAdaptive.from_privacy, setup=group_clip_setup),
    "dpsgd_f": _entry("dpsgd_f", mechanism=ClippingBias.from_privacy, setup=clipping_bias_setup),
    "dpsgd_global_adapt": _entry("dpsgd_global_adapt", mechanism=GlobalScaling.from_privacy,
                                 setup=global_scaling_setup),
}

GAIN_REFERENCES = tuple(dict.fromkeys(n for a in ALGORITHM_REGISTRY.values() for n in a.gain_against))
WITH_CONTROLS = tuple(a for a in ALGORITHM_REGISTRY.values() if a.controls is not None)


def algorithm(name) -> Algorithm:
    """The registered algorithm ``name``; ConfigError("algorithm.name", …) naming the known ones otherwise."""
    entry = find_algorithm(name)
    if entry is None:
        raise ConfigError("algorithm.name", f"unknown algorithm {name!r}; known: {', '.join(ALGORITHM_REGISTRY)}")
    return entry


def find_algorithm(name) -> Algorithm | None:
    """The registered algorithm ``name``, None for anything else (a stored run may carry no or an old name)."""
    return ALGORITHM_REGISTRY.get(name) if isinstance(name, str) else None


def draws(name, figure: str) -> bool:
    """Whether runs of the algorithm ``name`` draw the talk figure ``figure`` of its internals."""
    entry = find_algorithm(name)
    return entry is not None and figure in entry.figures
