"""The fault-injection switch: seeded draws at the configured rates, scopes, counts, hangs that stop."""

import threading
import time

import pytest

from trivium import faults
from trivium.config.schema import FaultsConfig
from trivium.faults import FaultInjector, FaultRates, InjectedFault


def test_draws_are_a_function_of_seed_key_site_and_call_only():
    a = FaultInjector(FaultRates(seed=3, workflow_raise=0.3, workflow_hang=0.05))
    b = FaultInjector(FaultRates(seed=3, workflow_raise=0.3, workflow_hang=0.05))
    keys = [(f"explore:{s}|{i}|train:{i}|0", "workflow", 0) for s in range(20) for i in range(16)]
    first = [a.draw(*k) for k in keys]
    assert [b.draw(*k) for k in reversed(keys)][::-1] == first  # order of the calls does not matter
    other = FaultInjector(FaultRates(seed=4, workflow_raise=0.3, workflow_hang=0.05))
    assert [other.draw(*k) for k in keys] != first


def test_rates_are_met_within_sampling_error():
    """n = 20000 draws: the count of each kind is Binomial(n, p); 4 standard deviations either side."""
    n, p_raise, p_hang = 20_000, 0.3, 0.05
    injector = FaultInjector(FaultRates(workflow_raise=p_raise, workflow_hang=p_hang))
    kinds = [injector.draw(f"k{i}", "workflow", 0) for i in range(n)]
    for kind, p in (("raise", p_raise), ("hang", p_hang)):
        sd = (n * p * (1 - p)) ** 0.5
        assert abs(kinds.count(kind) - n * p) < 4 * sd, kind
    counts = injector.take_counts()
    assert counts["faults/workflow_raise"] == kinds.count("raise")
    assert counts["faults/workflow_hang"] == kinds.count("hang")
    assert injector.take_counts()["faults/workflow_raise"] == 0  # counts since the last call


def test_nothing_is_injected_outside_a_scope_and_the_nth_call_draws_its_own():
    injector = FaultInjector(FaultRates(reward_raise=1.0))
    faults.at("reward", "exact_match")  # no scope: a no-op
    with injector.scope("explore:1|0|t|0") as scope, pytest.raises(InjectedFault, match="reward_raise"):
        faults.at("reward", "exact_match")
    assert scope.injected == ["reward_raise"] and scope.calls["reward"] == 1
    assert faults.current_injected() == []  # the scope ended with its block


def test_wrap_draws_in_the_scope_and_injects_where_the_function_runs():
    injector = FaultInjector(FaultRates(env_raise=1.0))
    with injector.scope("k"):
        wrapped = faults.wrap("env", lambda: "value", "grid.step")
    box = {}

    def run():
        try:
            wrapped()
        except InjectedFault as error:
            box["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert "env_raise at env grid.step" in str(box["error"])
    assert faults.wrap("env", len) is len  # outside a scope: the function itself


def test_a_hang_lasts_hang_s_or_one_and_a_half_timeouts():
    assert FaultInjector(FaultRates(workflow_hang=1, hang_s=7)).hang_seconds(2.0) == 7
    assert FaultInjector(FaultRates(workflow_hang=1)).hang_seconds(2.0) == 3.0
    assert FaultInjector(FaultRates(workflow_hang=1)).hang_seconds(None) is None
    injector = FaultInjector(FaultRates(workflow_hang=1.0))
    t0 = time.monotonic()
    with injector.scope("k"):
        faults.at("workflow", "math", limit_s=0.2)
    assert 0.3 <= time.monotonic() - t0 < 2.0


def test_rates_from_the_config_section_are_off_by_default():
    assert FaultRates.from_config(FaultsConfig()) is None
    rates = FaultRates.from_config(FaultsConfig(seed=5, env_hang=0.1, hang_s=2))
    assert rates == FaultRates(seed=5, env_hang=0.1, hang_s=2)


def test_config_checks_name_impossible_fault_settings(tmp_path):
    from trivium.config.errors import ConfigError
    from trivium.validation.load import load_config

    data = tmp_path / "t.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {path: some-model}\n"
        f"buffer: {{taskset: {{path: {data}, workflow_args: {{env_timeout_s: 0}}}}}}\n"
        "faults: {workflow_raise: 0.7, workflow_hang: 0.5, env_hang: 0.1}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, [], check_files=False)
    text = str(info.value)
    assert "faults.workflow_raise + faults.workflow_hang = 1.2" in text
    assert "explorer.workflow_timeout_s, which is 0" in text
    assert "env_timeout_s, which is 0" in text
