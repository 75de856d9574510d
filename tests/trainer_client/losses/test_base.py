"""The loss-channel contract: a third channel registered by a user, built from the config, whose
value is computed by hand; a channel that takes tokens away from the GRPO term; the registry's errors."""

from __future__ import annotations

import pytest
import torch
from trainer_batches import make_batch, make_trainer

from env_server.protocol.markers import Role
from trainer_client.config import ChannelConfig, load_config
from trainer_client.losses.base import (
    LossChannel,
    LossContext,
    ScoredBatch,
    available_channels,
    build_channel,
    channel_class,
    register_channel,
)
from trainer_client.trainer import DebateGRPOTrainer


@register_channel("test_head_l2")
class HeadL2(LossChannel):
    """``scale · Σ w²`` over the LM head's weights: a value the test computes by hand."""

    metric = "loss/head_l2"

    def __init__(self, weight: float, roles=None, scale: float = 1.0) -> None:
        super().__init__(weight, roles)
        self.scale = scale

    def bind(self, trainer) -> None:
        self.trainer = trainer

    def loss(self, model, inputs, context: LossContext):
        head = self.trainer.accelerator.unwrap_model(model).get_output_embeddings().weight
        value = self.scale * head.pow(2).sum()
        return value, {self.metric: value.item()}


def test_a_registered_channel_from_the_config_adds_its_hand_computed_value(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    config = load_config(None, None, {"channels": [{"name": "test_head_l2", "weight": 0.25, "params": {"scale": 1e-3}}]})
    [aux] = config.channels
    assert aux == ChannelConfig(name="test_head_l2", weight=0.25, params={"scale": 1e-3})
    plain = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "plain")
    ours = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "ours",
                        channels=[build_channel(aux.name, aux.weight, aux.params, aux.roles)])
    batch = make_batch(tokenizer)
    grpo = plain.compute_loss(model, dict(batch)).item()
    total = ours.compute_loss(model, dict(batch)).item()
    by_hand = 1e-3 * float((model.get_output_embeddings().weight.detach().double() ** 2).sum())
    assert ours._metrics["train"]["loss/head_l2"] == [pytest.approx(by_hand, rel=1e-5)]
    assert total == pytest.approx(grpo + 0.25 * by_hand, rel=1e-5)
    assert ours._metrics["train"]["loss/total"][-1] == pytest.approx(total, rel=1e-6)
    # the built-in channels' keys are still logged (0: off), so every metrics.jsonl has them
    assert ours._metrics["train"]["loss/sdpo_jsd"] == [0.0] and ours._metrics["train"]["loss/trace_replay_dpo"] == [0.0]


class RouteToNothing(LossChannel):
    """Takes every token of a rollout whose record says the solver was wrong away from GRPO
    (the routing SRPO does), and adds nothing itself."""

    metric = "loss/route"

    def prepare(self, batch: ScoredBatch):
        wrong = torch.tensor([[0.0] if not r.facts.first_answer_correct else [1.0] for r in batch.records])
        return wrong.expand_as(batch.output["completion_ids"]).clone()

    def loss(self, model, inputs, context):
        return None, {}


def test_a_channel_can_take_tokens_away_from_the_grpo_term() -> None:
    from types import SimpleNamespace

    records = [SimpleNamespace(facts=SimpleNamespace(first_answer_correct=ok)) for ok in (True, False)]
    output = {"completion_ids": torch.zeros((2, 5), dtype=torch.long)}
    mask = RouteToNothing(weight=1.0).prepare(ScoredBatch(output, records, [], [None, None], [], "train", 0))
    assert mask.tolist() == [[1.0] * 5, [0.0] * 5]


def test_roles_default_to_the_trained_roles_and_the_registry_says_what_it_knows() -> None:
    assert HeadL2(weight=1.0).roles == {Role.SOLVER, Role.VERIFIER}
    assert HeadL2(weight=1.0, roles=["solver"]).roles == {Role.SOLVER}
    assert {"sdpo_hint_distill", "trace_replay_dpo", "test_head_l2"} <= set(available_channels())
    from trainer_client.losses.hint_distillation import SDPOHintDistillation

    assert channel_class("trainer_client.losses.hint_distillation:SDPOHintDistillation") is SDPOHintDistillation
    with pytest.raises(KeyError, match="'hint_distillation' is now 'sdpo_hint_distill'"):
        channel_class("hint_distillation")
    with pytest.raises(TypeError, match="not an LossChannel"):
        channel_class("trainer_client.losses.hint_distillation:SDPOConfig")
    with pytest.raises(KeyError, match=r"registered: .*sdpo_hint_distill"):
        channel_class("no_such_loss")
    with pytest.raises(ValueError, match="already registered"):
        register_channel("sdpo_hint_distill")(HeadL2)
    with pytest.raises(ValueError, match="unknown loss channel"):
        load_config(None, None, {"channels": [{"name": "no_such_loss"}]})


def test_the_old_key_fails_with_one_line_naming_the_new_one() -> None:
    with pytest.raises(ValueError, match="`aux_losses` is now `channels`"):
        load_config(None, None, {"aux_losses": []})
