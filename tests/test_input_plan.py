"""``privacy-lab plan``'s flags go through the checks and caps of the run config's fields they stand for (issue 58,
point 2): a δ or a number of steps a run config refuses is refused in one line (exit 2) instead of sending the
planner into a search that does not end; ``rerun --set`` goes through the run config's whole validation."""
import contextlib
import json
import signal

import pytest
from in_process import cli_here

from engine.config.run import MAX_DELTA, MAX_TIERS, MAX_TOTAL_STEPS, MAX_TRAIN, RunConfig, check_plan_request
from engine.config.schema import ConfigError
from engine.store.db import RunStore

GOOD = {"--epsilons": ["1", "2"], "--tier-sizes": ["1000", "2000"], "--batch-size": ["100"], "--steps": ["100"]}


class TooSlow(BaseException):
    """Raised by the alarm: a command that should have ended at once is still running (not an Exception, so the
    CLI's one-line handler does not swallow it)."""


@contextlib.contextmanager
def within(seconds: float):
    def ring(*_):
        raise TooSlow(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def plan_with(store, **changes):
    flags = {**GOOD, **changes}
    return cli_here("plan", *[x for flag, values in flags.items() for x in (flag, *values)], store=store)


HOSTILE_FLAGS = [  # (flag changes, the field the one line names)
    ({"--delta": ["0.9"]}, "--delta"),  # a run config refuses it; the planner searched without end
    ({"--delta": [repr(MAX_DELTA * 1.02)]}, "--delta"),
    ({"--delta": ["0"]}, "--delta"),
    ({"--delta": ["nan"]}, "--delta"),
    ({"--steps": [str(MAX_TOTAL_STEPS + 1)]}, "--steps"),  # over a run config's cap
    ({"--steps": [str(10**12)]}, "--steps"),
    ({"--steps": ["0"]}, "--steps"),
    ({"--epsilons": ["inf", "2"]}, "--epsilons[0]"),
    ({"--epsilons": ["1", "nan"]}, "--epsilons[1]"),
    ({"--epsilons": ["0", "2"]}, "--epsilons[0]"),
    ({"--epsilons": ["1"] * (MAX_TIERS + 1), "--tier-sizes": ["10"] * (MAX_TIERS + 1)}, "--epsilons"),
    ({"--tier-sizes": ["1000"]}, "--tier-sizes"),
    ({"--tier-sizes": ["-5", "2000"]}, "--tier-sizes[0]"),
    ({"--tier-sizes": [str(MAX_TRAIN + 1), "2000"]}, "--tier-sizes[0]"),
    ({"--tier-sizes": [str(MAX_TRAIN), str(MAX_TRAIN)]}, "--tier-sizes"),
    ({"--batch-size": ["0"]}, "--batch-size"),
    ({"--batch-size": ["3001"]}, "--batch-size"),  # more than the tiers hold
    ({"--clip-norm": ["-1"]}, "--clip-norm"),
    ({"--clip-norm": ["inf"]}, "--clip-norm"),
]


@pytest.mark.parametrize("changes, field", HOSTILE_FLAGS, ids=[f"{f}-{'-'.join(c[next(iter(c))][:1])}"
                                                               for c, f in HOSTILE_FLAGS])
def test_a_hostile_plan_flag_is_one_line_exit_2_and_ends_at_once(store_path, changes, field):
    with within(20):
        out = plan_with(store_path, **changes)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and out.stdout == "", out.stderr
    assert lines[0].startswith(f"error: {field}:"), lines[0]


def test_the_steps_cap_is_lifted_as_a_run_configs_is(store_path):
    """--allow-large is the run config's "allow_large": the cap's message names it, and with it the plan is made."""
    out = plan_with(store_path, **{"--steps": [str(MAX_TOTAL_STEPS + 1)]})
    assert "--allow-large" in out.stderr
    with within(120):
        out = plan_with(store_path, **{"--steps": [str(MAX_TOTAL_STEPS + 1)], "--allow-large": [], "--json": []})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["steps"] == MAX_TOTAL_STEPS + 1


def test_plan_flags_beside_a_config_are_refused_not_ignored(tmp_path, store_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1}))
    for flag, value in (("--delta", "0.9"), ("--steps", "5"), ("--mode", "dpsgd"), ("--allow-large", None)):
        out = cli_here("plan", str(cfg), flag, *([value] if value else []), store=store_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {flag}:"), out.stderr


def test_the_plan_request_and_a_run_config_refuse_the_same_values():
    """One check per field: each value a run config refuses for δ, batch size, clip norm or a tier's ε is refused
    by the plan request too, and a value both accept passes both."""
    base = dict(epsilons=[1.0, 2.0], tier_sizes=[1000, 2000], delta=1e-5, batch_size=100, clip_norm=1.0, steps=100)
    check_plan_request(**base)
    cases = {"delta": (0.0, MAX_DELTA * 1.5, -1e-5, float("inf"), MAX_DELTA), "batch_size": (0, -3, 100.5, 50),
             "clip_norm": (0.0, -1.0, float("nan"), 3.0)}
    for field, values in cases.items():
        for value in values:
            run = _refused(lambda: RunConfig.from_dict({field: value}).validate())
            planned = _refused(lambda: check_plan_request(**{**base, field: value}))
            assert run == planned, (field, value, run, planned)
    for eps in (0.0, -1.0, float("inf"), 0.5):
        run = _refused(lambda: RunConfig.from_dict({"tiers": {"tiers": [{"epsilon": eps, "classes": [0]}]}}).validate())
        assert run == _refused(lambda: check_plan_request(**{**base, "epsilons": [eps, 2.0]})), eps


def _refused(call) -> bool:
    try:
        call()
    except ConfigError:
        return True
    return False


@pytest.mark.parametrize("override, field", [("delta=0.9", "delta"), ("epochs=2000000", "epochs"),
                                             ("algorithm.quantile=1.5", "algorithm.quantile"),
                                             ("algorithm.count_noise_std=-2", "algorithm.count_noise_std"),
                                             ('algorithm.group_by="nope"', "algorithm.group_by"),
                                             ("batch_size=0", "batch_size"), ("clip_norm=-1", "clip_norm")])
def test_rerun_set_goes_through_the_run_configs_whole_validation(store_path, override, field):
    RunStore(store_path).create_run(RunConfig().replace(**{"algorithm.name": "idp_sample"}).validate(),
                                    status="finished")
    with within(20):
        out = cli_here("rerun", "1", "--set", override, store=store_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}:"), out.stderr
    assert len(RunStore(store_path, readonly=True).list_runs()) == 1  # nothing was started


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "runs.sqlite"


@pytest.mark.slow
@pytest.mark.parametrize("mode, epsilons, sizes, delta", [("dpsgd", [1.0], [60000], 0.2),
                                                          ("sample", [1.0, 2.0], [20000, 20000], 0.05)])
def test_a_large_delta_a_run_config_accepts_is_planned_and_the_plan_ends(mode, epsilons, sizes, delta, monkeypatch):
    """At δ = 0.05–0.2 RDP's conversion gives ε ≤ 0 for some σ; its log was NaN and the σ search never ended (these
    two ran for minutes). Now they plan, every tier at most its target (the alarm only stops a hang: no timing)."""
    from engine.dp import accounting

    monkeypatch.setenv("PRIVACY_LAB_PLAN_CACHE", "off")
    accounting.clear_caches()
    with within(600):
        plan = accounting.plan(mode=mode, epsilons=epsilons, delta=delta, tier_sizes=sizes, batch_size=600,
                               clip_norm=1.0, steps=300)
    assert all(e <= t * (1 + 1e-9) for e, t in zip(plan.epsilons, epsilons)), (plan.epsilons, epsilons)
    assert all(e >= 0.99 * t for e, t in zip(plan.epsilons, epsilons))  # tight: the search found its σ

