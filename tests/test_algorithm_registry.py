"""The algorithm registry (``engine.dp.algorithms`` on ``engine.config.algorithms``): nothing else branches on an
algorithm's name, every entry is complete, and what the pages and figures show of an algorithm comes from it."""
from __future__ import annotations

import dataclasses
import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config.algorithms import ALGORITHM_SPECS, IDP_MODE, AlgorithmSpec
from engine.config.run import ALGORITHM_LABELS, ALGORITHMS, AlgorithmConfig, RunConfig
from engine.config.schema import ConfigError
from engine.dp import accounting
from engine.dp.algorithms import (ALGORITHM_REGISTRY, GAIN_REFERENCES, WITH_CONTROLS, Algorithm, algorithm, draws,
                                  find_algorithm)
from engine.dp.mechanisms import build_mechanism
from engine.dp.prepare import make_plan, prepare_data, prepare_privacy, total_steps

ROOT = Path(__file__).resolve().parent.parent
REGISTRY_MODULES = {ROOT / "engine" / "config" / "algorithms.py", ROOT / "engine" / "dp" / "algorithms.py"}

# A branch on an algorithm's config name (every name of the registry, so a new one is covered) outside the registry:
# ``algo.name == "ino"``, ``run.get("algorithm") != "dpsgd_s"``, ``"ino" == a.name``, ``name in ("idp_sample", …)``,
# ``"dpsgd_s" in names``. A planner mode that shares a name (``mode == "dpsgd"``) is no algorithm's name: only a
# subject named algorithm / algo / name counts.
_NAMES = "|".join(re.escape(n) for n in sorted(ALGORITHM_REGISTRY, key=len, reverse=True))
_SUBJECT = r"""(algorithm|algo|name)["']?\]?\)?"""
ALGORITHM_BRANCH = re.compile(rf"""{_SUBJECT}\s*[!=]=\s*["']({_NAMES})["']"""
                              rf"""|["']({_NAMES})["']\s*[!=]=\s*\w"""
                              rf"""|{_SUBJECT}\s+(not\s+)?in\s+[(\[{{]\s*["']({_NAMES})["']"""
                              rf"""|["']({_NAMES})["']\s+(not\s+)?in\s+\w""")

def algorithm_branches(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if path in REGISTRY_MODULES:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ALGORITHM_BRANCH.search(line.split("#")[0]):
                out.append(f"{rel}:{n}: {line.strip()}")
    return out


def test_no_branch_on_an_algorithm_name_outside_the_registry():
    """What differs between algorithms is a field of their ``engine.dp.algorithms.Algorithm``, never an if."""
    found = []
    for part in ("engine", "app_pages", "pages", "experiments"):
        if (ROOT / part).is_dir():
            found += algorithm_branches(ROOT / part)
    assert not found, "\n".join(found)


def test_the_algorithm_branch_pattern_finds_branches():
    hits = ['if algo.name == "dpsgd_s":', 'x = a if run.get("algorithm") != "ino" else b', 'if "ino" == a.name:',
            'refs = [r for r in runs if r.get("algorithm") in ("idp_sample", "idp_scale")]',
            'if algorithm == "nonprivate":', 'keep = a.get("name") != "nonprivate" or last',
            'if run["algorithm"] == "dpsgd":', 'missing = "dpsgd_s" in names', 'if cfg.algorithm.name not in ["ino"]:']
    misses = ['AlgorithmConfig(name="ino")', 'base.replace(**{"algorithm.name": "idp_sample", "name": ""})',
              'if mode == "dpsgd" or len(set(eps)) == 1:', 'frame[frame.kind == "ino"]', '{"name": "idp_sample"}',
              'algorithm_label("dpsgd_s")', 'for name, state_type in (("ino", InoState), ("group_clip", S)):',
              'ALGORITHMS = ("nonprivate", "dpsgd")', 'if entry is not None and entry.controls is not None:']
    assert [h for h in hits if not ALGORITHM_BRANCH.search(h)] == []
    assert [m for m in misses if ALGORITHM_BRANCH.search(m)] == []


# --- every entry is complete ----------------------------------------------------------------------------------

def test_the_registry_builds_on_the_spec_table_one_owner_per_fact():
    assert list(ALGORITHM_REGISTRY) == list(ALGORITHM_SPECS) == list(ALGORITHMS)
    for name, entry in ALGORITHM_REGISTRY.items():
        spec = ALGORITHM_SPECS[name]
        assert isinstance(entry, Algorithm) and isinstance(entry, AlgorithmSpec) and entry.name == name
        for f in dataclasses.fields(AlgorithmSpec):  # every spec fact as the config layer has it, none re-typed
            assert getattr(entry, f.name) == getattr(spec, f.name), (name, f.name)
    assert ALGORITHM_LABELS == {n: s.label for n, s in ALGORITHM_SPECS.items()}


@pytest.mark.parametrize("name", list(ALGORITHM_REGISTRY))
def test_every_entry_has_its_facts(name):
    a = algorithm(name)
    assert a.label.strip() and re.fullmatch(r"#[0-9A-Fa-f]{6}", a.colour) and a.symbol
    assert callable(a.mechanism) and callable(a.no_formal_dp_reason)
    config = AlgorithmConfig(name=name)
    config.validate()  # its own check accepts its defaults
    # a planner mode the planner knows (INO-SGD: each the config can name), None only without privacy
    modes = [a.mode(dataclasses.replace(config, idp_mode=m)) for m in ("sample", "scale")]
    assert all(m is None or m in accounting.MODES for m in modes)
    assert (a.plan_mode is None) == (not a.private) and (a.plan_mode == IDP_MODE) == (len(set(modes)) == 2)
    assert not a.private or a.no_formal_dp_reason(config) is None  # a private one's defaults have a guarantee
    assert set(a.gain_against) <= set(ALGORITHM_REGISTRY) and name not in a.gain_against
    assert a.controls is None or a.controls in ALGORITHM_REGISTRY
    from engine.figures.talk import TALK_FIGURES
    assert set(a.figures) <= set(TALK_FIGURES)
    assert all(draws(name, f) for f in a.figures) and not draws(name, "privacy_frontier")


def test_entries_are_told_apart():
    entries = list(ALGORITHM_REGISTRY.values())
    for field in ("label", "colour", "symbol", "picker_rank"):
        values = [str(getattr(a, field)).lower() for a in entries]
        assert len(set(values)) == len(values), field


def test_lookups():
    with pytest.raises(ConfigError, match="unknown algorithm 'nope'; known: nonprivate, dpsgd"):
        algorithm("nope")
    assert find_algorithm("nope") is None and find_algorithm(None) is None and find_algorithm("") is None
    assert not draws(None, "ino_internals") and not draws("nope", "ino_internals")
    assert GAIN_REFERENCES == ("idp_sample", "idp_scale") and [a.name for a in WITH_CONTROLS] == ["dpsgd_s"]


def test_gain_reference_is_the_idp_of_the_same_planner_mode():
    ino = algorithm("ino")
    assert ino.gain_reference(AlgorithmConfig(idp_mode="sample")) == "idp_sample"
    assert ino.gain_reference(AlgorithmConfig(idp_mode="scale")) == "idp_scale"
    assert algorithm("dpsgd").gain_reference(AlgorithmConfig(name="dpsgd")) is None


def test_labels_with_the_configuration():
    ino = algorithm("ino")
    assert ino.label_for(AlgorithmConfig()) == "INO-SGD"
    assert ino.label_for(AlgorithmConfig(tif="linear", idp_mode="scale")) == "INO-SGD (linear, SCALE)"
    assert ino.label_for(AlgorithmConfig(idp_mode="scale"), "mine") == "mine (beta, SCALE)"
    assert algorithm("dpsgd").label_for(AlgorithmConfig(name="dpsgd")) == "DP-SGD"


@pytest.fixture(scope="module")
def tiny():
    cfg = RunConfig().replace(**{"model.name": "lr", "data.max_train": 300, "batch_size": 64, "epochs": 1.0,
                                 "device": "cpu"})
    data = prepare_data(cfg)
    return cfg, data


@pytest.mark.parametrize("name", list(ALGORITHM_REGISTRY))
def test_every_mechanism_builds_and_steps_on_a_tiny_batch(tiny, name):
    """Its plan, its set-up and its mechanism for M = 2 models: one step's hooks give well-formed clips, weights
    and noise, and the mechanism says what the entry says (private, formal DP)."""
    cfg, data = tiny
    cfg = cfg.replace(**{"algorithm.name": name})
    a = algorithm(name)
    privacy = prepare_privacy(cfg, data, steps=total_steps(cfg, data.n_train))
    assert privacy.entry is a and (privacy.plan is None) == (not a.private)
    assert (make_plan(cfg, data.tiers.sizes, 5) is None) == (not a.private)
    assert (privacy.clip_setup is not None) == (a.setup is not None)
    assert (privacy.tail_length is not None) == (a.tail_length is not None)
    n = data.n_train
    mech = build_mechanism(privacy=privacy, members=np.ones((2, n), bool), device="cpu",
                           sample_tiers=np.asarray(data.tiers.train))
    assert mech.n_models == 2 and mech.private == a.private
    assert mech.formal_dp == (a.private and cfg.algorithm.no_formal_dp_reason is None)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(n, (2, 8), generator=gen)
    mask = torch.ones(2, 8, dtype=torch.bool)
    norms = 3.0 * torch.rand(2, 8, dtype=torch.float64, generator=gen)
    mech.see_batch(idx, types.SimpleNamespace(norms=norms), mask, torch.Generator())
    clip = mech.clip_norms(idx)
    assert tuple(clip.shape) == (2, 8)
    assert torch.all(clip > 0) and (torch.all(torch.isfinite(clip)) == a.private)
    rho = mech.weights(torch.rand(2, 8, dtype=torch.float64, generator=gen), clip, mask)
    assert rho is None or (tuple(rho.shape) == (2, 8) and torch.all((rho >= 0) & (rho <= 1)))
    noise = mech.noise_std()
    assert tuple(noise.shape) == (2,) and (torch.all(noise > 0) if a.private else torch.all(noise == 0))
    mech.observe(idx, norms, mask, gen)
    assert isinstance(mech.state(), dict)


# --- what the pages and figures show comes from it ------------------------------------------------------------

def test_figures_colours_markers_and_labels_are_the_registrys():
    from engine.figures import scaffold
    from engine.jobs.runs import algorithm_label
    for name, a in ALGORITHM_REGISTRY.items():
        assert scaffold.ALGORITHM_COLORS[name] == scaffold.algo_color(name) == a.colour
        assert scaffold.ALGORITHM_SYMBOLS[name] == scaffold.algo_symbol(name) == a.symbol
        assert algorithm_label(name) == ALGORITHM_LABELS[name] == a.label
        assert RunConfig().replace(**{"algorithm.name": name}).label == a.label
    assert set(scaffold.ALGORITHM_SYMBOLS) == set(ALGORITHM_REGISTRY)
    runs = [{"id": k, "algorithm": name} for k, name in enumerate(ALGORITHM_REGISTRY)]
    assert list(scaffold.run_colors(runs).values()) == [a.colour for a in ALGORITHM_REGISTRY.values()]


def test_the_pages_list_every_algorithm_from_the_registry():
    from app_pages import _one_run, _widgets
    assert _widgets.ALGORITHM_CHOICES == ["idp_sample", "ino", "idp_scale", "dpsgd", "dpsgd_s", "nonprivate",
                                          "dpsgd_f", "dpsgd_global_adapt"]
    assert _one_run.ALGORITHM_CHOICES == ["dpsgd", "idp_sample", "idp_scale", "ino", "dpsgd_s", "dpsgd_f",
                                          "dpsgd_global_adapt", "nonprivate"]
    assert _widgets.algorithm_fields("dpsgd_s", group_by="class", tail_fraction=0.3) == {"group_by": "class"}
    assert _widgets.algorithm_fields("ino", group_by="class", tail_fraction=0.3) == {"tail_fraction": 0.3}
    assert _widgets.algorithm_fields("dpsgd", group_by="class", tail_fraction=0.3) == {}
