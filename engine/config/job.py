"""A job that trains one RunConfig per algorithm (the PA-ALOOA audit, the one-run audit): its ``algorithms`` and
its ``run`` object, parsed, validated and written the same way for every such job.

    validate_algorithms(algorithms)          a non-empty tuple of valid AlgorithmConfigs (errors name algorithms[k])
    algorithms_advisories(algorithms)        the valid values each ignores (advisories naming algorithms[k].field)
    parse_algorithms(value, path)            names or objects → AlgorithmConfigs
    parse_run(value, path, default, refused) the job's ``run`` over its defaults, the keys it does not use refused
    run_dict(run, refused)                   what the job stores as its ``run``
    algorithm_keys(config)                   unique keys (dpsgd, ino, ino_2 …) in the configured order
"""
from __future__ import annotations

from engine.config.run import ALGORITHMS, AlgorithmConfig, RunConfig, TiersConfig
from engine.config.schema import ConfigError, parse_section


def validate_algorithms(algorithms) -> None:
    """A job's ``algorithms``: a non-empty tuple of valid AlgorithmConfigs (errors name ``algorithms[k]``)."""
    if not isinstance(algorithms, tuple) or not algorithms:
        raise ConfigError("algorithms", "at least one algorithm is needed")
    for k, algo in enumerate(algorithms):
        if not isinstance(algo, AlgorithmConfig):
            raise ConfigError(f"algorithms[{k}]", f"must be an algorithm object, got {algo!r}")
        try:
            algo.validate()
        except ConfigError as e:
            raise ConfigError(e.field.replace("algorithm", f"algorithms[{k}]", 1), e.message) from None


def algorithms_advisories(algorithms) -> list[ConfigError]:
    """The valid values each of a job's algorithms ignores (``AlgorithmConfig.advisories``), named
    ``algorithms[k].field``: warnings, the job trains as if they were unset."""
    return [e for k, algo in enumerate(algorithms) for e in algo.advisories(f"algorithms[{k}].")]


def parse_run(value, path: str, *, default: RunConfig, refused: dict) -> RunConfig:
    """The ``run`` object of a job config that trains with a RunConfig of its own: ``default``'s fields under
    what is given (one level deep), the ``refused`` keys (key → why) refused naming the dotted key."""
    if not isinstance(value, dict):
        raise ConfigError(path, "must be a JSON object")
    for key in value:
        if key in refused:
            raise ConfigError(f"{path}.{key}", f"not part of an audit: {refused[key]}")
    merged = run_dict(default, refused)
    for key, v in value.items():  # the audit's defaults under what is given, one level deep
        merged[key] = {**merged[key], **v} if isinstance(v, dict) and isinstance(merged.get(key), dict) and \
            key != "tiers" else v
    return parse_section(RunConfig, merged, path + ".", parsers={"tiers": _parse_tiers})


def run_dict(run: RunConfig, refused: dict) -> dict:
    """``run.to_dict()`` without the ``refused`` keys: what a job config stores as its ``run``."""
    return {k: v for k, v in run.to_dict().items() if k not in refused}


def _parse_tiers(value, path: str) -> TiersConfig | None:
    return None if value is None else parse_section(TiersConfig, value, path + ".")


def parse_algorithms(value, path: str) -> tuple[AlgorithmConfig, ...]:
    if not isinstance(value, list):
        raise ConfigError(path, "must be a list of algorithm names or objects")
    algos = []
    for k, a in enumerate(value):
        if isinstance(a, str):
            if a not in ALGORITHMS:
                raise ConfigError(f"{path}[{k}]", f"unknown algorithm {a!r}; allowed: {', '.join(ALGORITHMS)}")
            algos.append(AlgorithmConfig(name=a))
        else:
            algos.append(parse_section(AlgorithmConfig, a, f"{path}[{k}]."))
    return tuple(algos)


def algorithm_keys(config) -> list[str]:
    """Unique keys (``dpsgd``, ``ino``, ``ino_2`` …) of ``config.algorithms`` in the configured order."""
    seen: dict[str, int] = {}
    keys = []
    for a in config.algorithms:
        seen[a.name] = seen.get(a.name, 0) + 1
        keys.append(a.name if seen[a.name] == 1 else f"{a.name}_{seen[a.name]}")
    return keys
