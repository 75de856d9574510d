"""Role routing on a real TRL trainer with real PEFT adapters on the tiny model: every token is
scored by its role's adapter, a role's loss trains only its adapter, a frozen role never moves."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trainer_batches import make_batch, make_trainer
from transformers import AutoModelForCausalLM

from env_server.protocol.markers import Role
from trainer_client.config import SDPOConfig, load_config
from trainer_client.policies.adapters import adapter_parameters, attach_adapters, optimizer_groups, use_route
from trainer_client.policies.routing import ROUTES, RoleRouter
from trainer_client.rollout.rows import RowTracker
from trainer_client.trainer import DebateGRPOTrainer

POLICIES = {"policies.solver.adapter": "solver", "policies.verifier.adapter": "verifier", "policies.judge.frozen": True,
            "policies.verifier.learning_rate": 2e-2}
SOLVER, VERIFIER, NONE = 0, 1, -1


def test_row_tracker_finds_each_tool_loop_prompt_in_the_batch() -> None:
    tracker = RowTracker()
    tracker.start()
    first = [[1, 2], [1, 2], [1, 2]]  # a group: the same prompt three times
    assert tracker.rows(first) == [0, 1, 2]
    tracker.advance([0, 1, 2], first, [[5], [6], [5]])
    # rows 1 and 2 called a tool: each prompt is the row so far plus the tool result
    assert tracker.rows([[1, 2, 6, 9], [1, 2, 5, 9]]) == [1, 2]
    tracker.advance([1, 2], [[1, 2, 6, 9], [1, 2, 5, 9]], [[7], [8]])
    assert tracker.rows([[1, 2, 5, 9, 8, 9]]) == [2]
    with pytest.raises(RuntimeError, match="extends no rollout"):
        tracker.rows([[3, 3, 3]])


@pytest.fixture
def routed(tiny_model_dir, model_and_tokenizer, tmp_path):
    """A trainer over the tiny model with two hand-set adapters (different non-zero LoRA B
    matrices, so the two roles' policies differ) and a frozen judge."""
    _, tokenizer = model_and_tokenizer
    policies = load_config(None, None, POLICIES).policies
    model = attach_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), policies)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in ("solver", "verifier"):
            for key, param in adapter_parameters(model, name).items():
                if "lora_B" in key:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    model.train()
    optimizer = torch.optim.AdamW(optimizer_groups(model, policies, 1e-2))
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, policies=policies, optimizers=(optimizer, None),
                           sdpo=SDPOConfig(alpha=0.1), hints={"verifier/false_accept": "Check the answer again."})
    return trainer, model, tokenizer, optimizer


def routed_batch(tokenizer, routes: list[list[int]], loss: list[list[int]]) -> dict:
    """The constructed two-row batch with each token's adapter and a loss mask."""
    batch = make_batch(tokenizer)
    batch[ROUTES] = torch.tensor(routes)
    batch["tool_mask"] = torch.tensor(loss)
    return batch


def completion_logps(model, batch: dict, route: str) -> torch.Tensor:
    """``(B, T)`` log-probs of the completion tokens under ``route``'s policy, by a plain forward."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    width = batch["completion_ids"].shape[1]
    with use_route(model, route):
        logits = model(input_ids=ids).logits[:, -width - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def test_every_token_is_scored_by_its_roles_adapter(routed) -> None:
    trainer, model, tokenizer, _ = routed
    routes = [[SOLVER] * 6 + [VERIFIER] * 6, [NONE] * 4 + [VERIFIER] * 4 + [SOLVER] * 4]
    batch = routed_batch(tokenizer, routes, [[1] * 12, [0] * 4 + [1] * 8])
    router: RoleRouter = trainer.role_router

    def forward(module):
        return completion_logps(model, batch, "shared"), None, None  # the adapter the router made active

    with torch.no_grad():
        got, _, _ = router.logps(model, batch[ROUTES], forward)
        solver, verifier = completion_logps(model, batch, "adapter:solver"), completion_logps(model, batch, "adapter:verifier")
    assert not torch.allclose(solver, verifier)  # the hand-set adapters give the roles different policies
    where = batch[ROUTES]
    assert torch.equal(got[where == SOLVER], solver[where == SOLVER])
    assert torch.equal(got[where == VERIFIER], verifier[where == VERIFIER])


def _grads(model, name: str) -> torch.Tensor:
    params = adapter_parameters(model, name).values()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


def test_a_roles_loss_reaches_its_adapter_only_through_its_own_log_probs(routed) -> None:
    trainer, model, tokenizer, _ = routed
    routes = [[SOLVER] * 6 + [VERIFIER] * 6, [SOLVER] * 12]
    only_verifier = [[0] * 6 + [1] * 6, [0] * 12]  # the loss is on row 0's verifier tokens alone
    batch = routed_batch(tokenizer, routes, only_verifier)
    model.zero_grad()
    trainer.compute_loss(model, dict(batch)).backward()
    assert not _grads(model, "solver").any()
    from_loss = _grads(model, "verifier")
    # the same direction as the gradient of -Σ A_t log π_verifier(y_t) over those tokens (GRPO at ratio 1)
    model.zero_grad()
    logps = completion_logps(model, batch, "adapter:verifier")
    mask = torch.tensor(only_verifier, dtype=torch.float32)
    (-(batch["advantages"] * logps * mask).sum()).backward()
    direct = _grads(model, "verifier")
    assert torch.nn.functional.cosine_similarity(from_loss, direct, dim=0) > 0.9999
    model.zero_grad()


def test_a_solver_only_loss_leaves_the_verifier_adapter_and_the_frozen_judge_bit_identical(routed) -> None:
    trainer, model, tokenizer, optimizer = routed
    assert {group["adapter"]: group["lr"] for group in optimizer.param_groups} == {"solver": 1e-2, "verifier": 2e-2}
    # row 1 holds a judge turn (no adapter, out of the loss); everything in the loss is the solver's
    batch = routed_batch(tokenizer, [[SOLVER] * 12, [NONE] * 5 + [SOLVER] * 7], [[1] * 12, [0] * 5 + [1] * 7])
    verifier_before = {k: p.detach().clone() for k, p in adapter_parameters(model, "verifier").items()}
    solver_before = {k: p.detach().clone() for k, p in adapter_parameters(model, "solver").items()}
    with torch.no_grad():
        judge_before = completion_logps(model, batch, "frozen")
    for _ in range(3):
        optimizer.zero_grad()
        trainer.compute_loss(model, dict(batch)).backward()
        optimizer.step()
    verifier_after = adapter_parameters(model, "verifier")
    assert all(torch.equal(verifier_after[k], v) for k, v in verifier_before.items())
    solver_after = adapter_parameters(model, "solver")
    assert any(not torch.equal(solver_after[k], v) for k, v in solver_before.items())  # the solver did train
    with torch.no_grad():
        assert torch.equal(completion_logps(model, batch, "frozen"), judge_before)  # the base never moves
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


def test_hint_distillation_trains_the_adapter_of_the_role_that_erred(routed) -> None:
    trainer, model, tokenizer, _ = routed
    batch = routed_batch(tokenizer, [[SOLVER] * 6 + [VERIFIER] * 6, [SOLVER] * 12], [[0] * 12, [0] * 12])
    batch["sdpo_sites"] = [[(6, 12, "verifier/false_accept")], []]
    model.zero_grad()
    value, _ = trainer.hint_distillation.loss(model, dict(batch), _context())
    assert value is not None and value.item() > 0
    value.backward()
    assert _grads(model, "verifier").any() and not _grads(model, "solver").any()
    # the same value as the plain site loss with the verifier's adapter on
    with use_route(model, "adapter:verifier"):
        plain = trainer.hint_distillation.site_loss(model, dict(batch), None)
    assert value.item() == pytest.approx(plain.item(), rel=1e-6)
    model.zero_grad()


def test_per_role_scores_each_item_under_its_roles_policy_in_order(routed) -> None:
    trainer, model, tokenizer, _ = routed
    batch = make_batch(tokenizer)
    roles = [Role.VERIFIER, Role.SOLVER, Role.JUDGE, Role.VERIFIER]

    def score(items):  # row 0's completion log-prob sum under whatever policy is active
        total = completion_logps(model, batch, "shared")[0].sum()
        return (total.repeat(len(items)),)

    with torch.no_grad():
        (got,) = trainer.role_router.per_role(model, list(range(4)), lambda i: roles[i], score)
        want = {route: completion_logps(model, batch, route)[0].sum()
                for route in ("adapter:solver", "adapter:verifier", "frozen")}
    assert got.tolist() == pytest.approx([want["adapter:verifier"].item(), want["adapter:solver"].item(),
                                          want["frozen"].item(), want["adapter:verifier"].item()])


def _context():
    from trainer_client.losses.base import LossContext

    return LossContext("train", 1, 0, None)


def test_an_adapter_named_like_a_module_takes_only_its_own_parameters(tiny_model_dir) -> None:
    # "mlp" and "q_proj" are module names too; each adapter's parameters are its own, none shared
    policies = load_config(None, None, {"policies.solver.adapter": "mlp", "policies.verifier.adapter": "q_proj"}).policies
    model = attach_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), policies)
    mlp, q_proj = adapter_parameters(model, "mlp"), adapter_parameters(model, "q_proj")
    assert mlp and q_proj and not set(mlp) & set(q_proj)
    assert all(".lora_A.mlp." in k or ".lora_B.mlp." in k for k in mlp)
    groups = optimizer_groups(model, policies, 1e-3)  # no parameter in two groups
    assert sum(len(g["params"]) for g in groups) == len({id(p) for g in groups for p in g["params"]})
