"""``policies.phases``: the adapters train in turn. A paused adapter keeps its weights and its
Adam state bit-identical through a real AdamW step on a real PEFT model, while the phase's own
adapter moves; the schedule is checked at load in one line."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, TrainerControl, TrainerState

from env_server.protocol.markers import Role
from trainer_client.config import config_error_line, load_config
from trainer_client.policies.adapters import adapter_parameters, attach_adapters, optimizer_groups, use_route
from trainer_client.policies.phases import PHASE_METRIC, PhaseCallback

ADAPTERS = {"policies.solver.adapter": "solver", "policies.verifier.adapter": "verifier", "policies.judge.frozen": True}
PHASES = {**ADAPTERS, "policies.phases.steps": 2, "policies.phases.order": ["verifier", "solver"]}


def test_the_schedule_cycles_through_the_order_by_optimizer_step() -> None:
    policies = load_config(None, None, {**PHASES, "policies.phases.order": ["verifier", "verifier", "solver"]}).policies
    assert [policies.phases.role_at(s) for s in range(7)] == [Role.VERIFIER] * 4 + [Role.SOLVER] * 2 + [Role.VERIFIER]
    assert [policies.phase_adapter(s) for s in (0, 3, 4, 5, 6)] == ["verifier", "verifier", "solver", "solver", "verifier"]
    assert load_config(None, None, ADAPTERS).policies.phase_adapter(5) is None  # no phases: every adapter, every step
    with pytest.raises(ValueError, match="step -1 < 0"):
        policies.phases.role_at(-1)


@pytest.mark.parametrize(("overrides", "message"), [
    ({**PHASES, "policies.phases.order": ["verifier", "judge"]}, "phases.order names judge, which has no adapter"),
    ({**PHASES, "policies.phases.order": ["verifier", "verifier"]}, "trains one adapter only"),
    ({**PHASES, "policies.phases.order": ["verifier"]}, "policies.phases.order: List should have at least 2 items"),
    ({**PHASES, "policies.phases.steps": 0}, "policies.phases.steps"),
    ({"policies.solver.adapter": "a", "policies.verifier.adapter": "a", "policies.phases.steps": 5,
      "policies.phases.order": ["solver", "verifier"]}, "trains one adapter only"),
])
def test_a_schedule_that_cannot_alternate_fails_at_load_in_one_line(overrides, message) -> None:
    with pytest.raises(ValidationError) as caught:
        load_config(None, None, overrides)
    line = config_error_line(caught.value)
    assert message in line and "\n" not in line, line


def _both_adapters_get_gradients(model) -> None:
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    loss = torch.zeros(())
    for name in ("solver", "verifier"):
        with use_route(model, f"adapter:{name}"):
            loss = loss + model(input_ids=ids).logits.float().pow(2).mean()
    loss.backward()


def test_a_paused_adapter_keeps_its_weights_and_adam_state_through_a_real_step(tiny_model_dir) -> None:
    policies = load_config(None, None, PHASES).policies
    model = attach_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), policies)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero B: every LoRA matrix gets a gradient
        for name in ("solver", "verifier"):
            for key, param in adapter_parameters(model, name).items():
                if "lora_B" in key:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    optimizer = torch.optim.AdamW(optimizer_groups(model, policies, 1e-2, weight_decay=0.1))
    callback = PhaseCallback(policies, optimizer)
    state, control = TrainerState(), TrainerControl()

    def snapshot(name: str) -> dict[str, torch.Tensor]:
        return {k: p.detach().clone() for k, p in adapter_parameters(model, name).items()}

    for step, trained, paused in ((0, "verifier", "solver"), (1, "verifier", "solver"), (2, "solver", "verifier")):
        before = {name: snapshot(name) for name in ("solver", "verifier")}
        paused_state = {k: {s: v.clone() for s, v in optimizer.state[p].items()}
                        for k, p in adapter_parameters(model, paused).items() if p in optimizer.state}
        _both_adapters_get_gradients(model)
        assert all(p.grad is not None for p in adapter_parameters(model, paused).values())
        state.global_step = step
        callback.on_pre_optimizer_step(None, state, control)
        optimizer.step()
        optimizer.zero_grad()
        after = {name: snapshot(name) for name in ("solver", "verifier")}
        assert all(torch.equal(before[paused][k], after[paused][k]) for k in after[paused]), step  # not one bit moved
        assert all(not torch.equal(before[trained][k], after[trained][k]) for k in after[trained]), step
        # the paused adapter's Adam moments are as they were (none before its first phase)
        now = {k: optimizer.state[p] for k, p in adapter_parameters(model, paused).items() if p in optimizer.state}
        assert now.keys() == paused_state.keys()
        assert all(torch.equal(now[k][s], paused_state[k][s]) for k in now for s in now[k]), step

    logs = {"loss": 0.1}
    state.global_step = 3  # the line of optimizer step 2, the first solver phase: index 1 in the order
    callback.on_log(None, state, control, logs=logs)
    assert logs[PHASE_METRIC] == 1.0


def test_the_callback_needs_phases_and_named_groups(tiny_model_dir) -> None:
    policies = load_config(None, None, ADAPTERS).policies
    model = attach_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), policies)
    with pytest.raises(ValueError, match=r"needs policies\.phases"):
        PhaseCallback(policies, torch.optim.AdamW(optimizer_groups(model, policies, 1e-3)))
    with pytest.raises(ValueError, match="must name its adapter"):
        PhaseCallback(load_config(None, None, PHASES).policies, torch.optim.AdamW(model.parameters()))
