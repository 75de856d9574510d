"""The ``policies`` section: routes per role, and every invalid combination refused at load in one line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from env_server.protocol.markers import Role
from trainer_client.cli import main
from trainer_client.config import config_error_line, load_config

ADAPTERS = {"policies.solver.adapter": "solver", "policies.verifier.adapter": "verifier", "policies.judge.frozen": True}


def test_no_section_is_the_shared_policy_of_old() -> None:
    policies = load_config().policies
    assert not policies.active and policies.adapters == []
    assert {policies.route(role) for role in Role} == {"shared"} and all(policies.trained(r) for r in Role)


def test_routes_learning_rates_and_lora_settings() -> None:
    policies = load_config(None, None, {**ADAPTERS, "policies.lora.r": 4, "policies.verifier.learning_rate": 1e-3,
                                        "policies.verifier.lora": {"r": 16, "alpha": 32}}).policies
    assert [policies.route(role) for role in Role] == ["adapter:solver", "adapter:verifier", "frozen"]
    assert policies.route(None) == "frozen"  # a turn after the debate ended: the base, adapters off
    assert policies.adapters == ["solver", "verifier"]
    assert policies.lora_of("solver").r == 4 and policies.lora_of("verifier").r == 16
    assert policies.learning_rate_of("solver", 1e-5) == 1e-5 and policies.learning_rate_of("verifier", 1e-5) == 1e-3
    assert not policies.trained(Role.JUDGE) and policies.trained(Role.SOLVER)
    # a role without an entry plays the base, which adapters freeze
    only_solver = load_config(None, None, {"policies.solver.adapter": "s"}).policies
    assert only_solver.route(Role.VERIFIER) == "frozen" and not only_solver.trained(Role.VERIFIER)
    # two roles may share an adapter; an endpoint without adapters leaves the base shared and trained
    shared = load_config(None, None, {"policies.solver.adapter": "a", "policies.verifier.adapter": "a"}).policies
    assert shared.adapters == ["a"] and shared.adapter_roles("a") == [Role.SOLVER, Role.VERIFIER]
    endpoint = load_config(None, None, {"policies.judge.endpoint": "openai:http://h:1/v1#m"}).policies
    assert endpoint.route(Role.JUDGE) == "endpoint" and endpoint.route(Role.SOLVER) == "shared"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"policies.judge.adapter": "judge"}, "policies.judge: the judge is never trained"),
    ({"policies.judge.frozen": True}, "frozen: true needs the base weights frozen"),
    ({"policies.solver.adapter": "s", "policies.solver.frozen": True}, "exactly one of adapter, frozen: true or endpoint"),
    ({"policies.solver": {}}, "exactly one of adapter, frozen: true or endpoint (got none)"),
    ({"policies.verifier.endpoint": "http://h:1/v1"}, "bad endpoint"),
    ({"policies.verifier.endpoint": "openai:http://h:1/v1"}, "bad endpoint"),
    ({"policies.solver.adapter": "ref"}, "adapter name 'ref'"),
    ({"policies.solver.adapter": "a/b"}, "adapter name 'a/b'"),
    ({**ADAPTERS, "policies.judge.learning_rate": 1e-4}, "learning_rate and lora belong to an adapter"),
    ({"policies.solver.adapter": "a", "policies.verifier.adapter": "a", "policies.solver.learning_rate": 1e-4,
      "policies.verifier.learning_rate": 1e-3}, "adapter 'a' is shared by solver, verifier with different"),
    ({**ADAPTERS, "policies.lora.r": 0}, "policies.lora.r"),
    ({**ADAPTERS, "policies.critic.adapter": "c"}, "policies.critic"),
    ({**ADAPTERS, "use_vllm": True}, "per-request LoRA with vLLM is not wired yet"),
])
def test_invalid_combinations_fail_at_load_in_one_line(overrides, message) -> None:
    with pytest.raises(ValidationError) as caught:
        load_config(None, None, overrides)
    line = config_error_line(caught.value)
    assert message in line and "\n" not in line, line


def test_the_train_command_exits_2_with_one_line(capsys) -> None:
    assert main(["train", "--env-url", "http://127.0.0.1:9", "-o", "policies.judge.adapter=judge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "policies.judge: the judge is never trained" in err
