"""The configuration tree: what a run (and an audit's models) is asked to do, validated before anything runs.

    run.py         RunConfig: one frozen dataclass tree per run (data, tiers, model, optimizer, algorithm),
                   canonical JSON, its advisories (valid values far from what trains or that the algorithm
                   ignores), ``parse_tiers_param``
    limits.py      the limits on requested work and values (``MAX_*``), the one steps formula, the checks of a
                   privacy plan's fields shared by run configs and ``privacy-lab plan``'s flags
    algorithms.py  the algorithms' plain facts, the one table of them (``AlgorithmSpec``: name, label, colour,
                   planner mode, formal-DP rule, the fields each reads, every field's values valid for any
                   algorithm — the TIF knots rule among them —, gain partner, controls); ``engine.dp.algorithms``
                   builds the registry on it
    job.py         a job that trains one RunConfig per algorithm (the audits): its ``algorithms`` and ``run``,
                   parsed and validated once
    backend.py     BackendConfig: where an audit's chunks train (local, a Ray instance here, a cluster's address)
    schema.py      the one typed validation (``check_int``, ``check_number``, …, ``parse_section``), safe
                   config-file reading, ``ConfigError``

Layer 2 of data → config → store → models → dp → train → audit → jobs → figures → tools → cli: may import engine.data (the registered dataset names) and nothing above.
"""
