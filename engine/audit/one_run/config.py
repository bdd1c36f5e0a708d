"""The one-run audit's configuration: one frozen :class:`OneRunConfig` holding the RunConfig its runs train with
(one run per listed algorithm, each with the same canaries) plus the audit's own fields. JSON round-trip; every
ConfigError names a dotted field.

    {"run": {"data": {"name": "mnist"}, "tiers": {...}, "epochs": 4.0, "batch_size": 256, ...},
     "algorithms": ["dpsgd", "idp_sample", "idp_scale", "ino", {"name": "dpsgd_s", "group_by": "tier"}],
     "canaries": 500, "input_canaries": 500, "canary_norm": 1.0, "canary_slots": "spare", "beta": 0.05,
     "white_score": "likelihood", "name": ""}

``canaries``: white-box gradient canaries per tier; ``input_canaries``: black-box input canaries (mislabeled test
examples) per tier, at most what half the test set affords (the rest measures accuracy); 0 turns a kind off.
A ``run`` object only needs the fields that differ from :data:`DEFAULT_ONE_RUN` (one level deep).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from engine.config.job import parse_algorithms, parse_run, run_dict, validate_algorithms
from engine.config.run import AlgorithmConfig, DataConfig, RunConfig
from engine.config.schema import (ConfigError, check_choice, check_int, check_number, check_section, check_str, parse_config_json,
                                  parse_section, read_config_text, replace_dotted)

ONE_RUN_ALGORITHMS = (
    AlgorithmConfig(name="dpsgd"),
    AlgorithmConfig(name="idp_sample"),
    AlgorithmConfig(name="idp_scale"),
    AlgorithmConfig(name="ino"),
    AlgorithmConfig(name="dpsgd_s", group_by="tier"),
)
# the dashboard's paper tiers (ε 1/2/3 by class) on the shipped digits set: starts offline on a fresh machine
DEFAULT_ONE_RUN = RunConfig(data=DataConfig(name="digits"), epochs=10.0, batch_size=128)
_NOT_IN_ONE_RUN = {"algorithm": "a one-run audit lists its algorithms in the top-level 'algorithms'",
                   "eval_every": "a one-run audit evaluates each model once, at the end",
                   "name": "a one-run audit's name is the top-level 'name'",
                   "seeds": "a one-run audit trains one run per algorithm",
                   "seed_index": "a one-run audit trains one run per algorithm"}
MAX_CANARIES = 100_000
WHITE_SCORES = ("likelihood", "sum")
CANARY_SLOTS = ("spare", "model")


@dataclass(frozen=True)
class OneRunConfig:
    """One run per algorithm with per-tier canaries; per tier the empirical ε̂ next to the claimed ε."""

    run: RunConfig = DEFAULT_ONE_RUN
    algorithms: tuple[AlgorithmConfig, ...] = ONE_RUN_ALGORITHMS
    canaries: int = 500  # white-box gradient canaries per tier (0: none)
    input_canaries: int = 500  # black-box input canaries per tier (0: none; capped by half the test set)
    canary_norm: float = 1.0  # a gradient canary's norm, in units of its tier's clip (≥ 1: clipped to exactly C_k)
    # where the gradient canaries live: "spare" — coordinates of their own, noised with the update, that no input's
    # gradient reaches (the score sees the canary and the noise only: the strongest white-box attack); "model" —
    # distinct coordinates of the model's parameters (the canaries push the weights, and every other sample's
    # gradient at those coordinates blurs the score)
    canary_slots: str = "spare"
    beta: float = 0.05  # the bounds hold with confidence 1 − β
    # the white-box score: "likelihood" (per-step likelihood ratio of a Poisson-subsampled Gaussian step, the most
    # powerful test of one step) or "sum" (Σ_t of the noisy update at the canary's coordinate)
    white_score: str = "likelihood"
    name: str = ""

    def validate(self) -> "OneRunConfig":
        if not isinstance(self.run, RunConfig):
            raise ConfigError("run", f"must be a run configuration, got {type(self.run).__name__}")
        check_section(self, "", skip=("run", "algorithms"))
        if self.run.tiers is None:
            raise ConfigError("run.tiers", "a one-run audit needs tiers (their ε are what it checks)")
        try:
            self.run.validate()
        except ConfigError as e:
            raise e.under("run.") from None
        validate_algorithms(self.algorithms)
        check_int(self.canaries, "canaries", 0, MAX_CANARIES)
        check_int(self.input_canaries, "input_canaries", 0, MAX_CANARIES)
        if self.canaries == 0 and self.input_canaries == 0:
            raise ConfigError("canaries", "no canaries: give canaries (white-box) or input_canaries (black-box) > 0")
        check_number(self.canary_norm, "canary_norm", 1.0, 1e6)
        check_choice(self.canary_slots, "canary_slots", CANARY_SLOTS)
        check_number(self.beta, "beta", 0.0, 0.5, low_open=True)
        check_choice(self.white_score, "white_score", WHITE_SCORES)
        check_str(self.name, "name", max_len=200)
        return self

    def run_for(self, algorithm: AlgorithmConfig) -> RunConfig:
        """The run of one algorithm: this audit's run with ``algorithm``, one seed."""
        return dataclasses.replace(self.run, algorithm=algorithm, seeds=1, seed_index=0)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["run"] = run_dict(self.run, _NOT_IN_ONE_RUN)
        d["algorithms"] = [dataclasses.asdict(a) for a in self.algorithms]
        return json.loads(json.dumps(d))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "OneRunConfig":
        """Parse (not validate) a one-run audit config."""
        if not isinstance(d, dict):
            raise ConfigError("config", "must be a JSON object")
        return parse_section(cls, d, "", parsers={"run": _parse_run, "algorithms": parse_algorithms})

    @classmethod
    def from_json(cls, text: str) -> "OneRunConfig":
        return cls.from_dict(parse_config_json(text))

    def replace(self, **changes) -> "OneRunConfig":
        out = self
        for key, value in changes.items():
            out = replace_dotted(out, key, value)
        return out


def _parse_run(value, path: str) -> RunConfig:
    return parse_run(value, path, default=DEFAULT_ONE_RUN, refused=_NOT_IN_ONE_RUN)


def load_one_run_config(path: str) -> OneRunConfig:
    """Read and validate a one-run audit configuration file (JSON)."""
    return OneRunConfig.from_json(read_config_text(path)).validate()
