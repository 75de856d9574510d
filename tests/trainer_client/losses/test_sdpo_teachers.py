"""Hint distillation's teacher (issue 56 item 2), with TRL's names: ``teacher_model_kind``
``base`` (the step-0 policy) and ``ema`` (``θ_T ← (1 − r)·θ_T + r·θ`` after every optimizer step),
a successful sibling's action in the teacher's hint (SDPO's reprompt), and distillation on failed
rollouts only. Real TRL trainer, real tiny model; divergences recomputed by hand from the
teacher's own forward."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trainer_batches import make_batch, make_trainer
from transformers import AutoModelForCausalLM, TrainerControl, TrainerState

from env_server.protocol.markers import Role
from env_server.protocol.models import CounterfactualFacts, EpisodeRewards, TurnReward
from trainer_client.config import SDPOConfig, load_config
from trainer_client.losses.base import ScoredBatch
from trainer_client.losses.functional import masked_jsd_loss
from trainer_client.losses.hint_distillation import SITES
from trainer_client.losses.replay_pairs import tool_call_message, tool_call_response_ids
from trainer_client.losses.sdpo_teacher import EMATeacherCallback
from trainer_client.losses.settings import SUCCESSFUL_TEMPLATE
from trainer_client.model.forward import pack_responses, response_hidden
from trainer_client.rollout.branches import reply_action
from trainer_client.rollout.segments import Segment, SegmentOwner
from trainer_client.trainer import DebateGRPOTrainer

HINTS = {"solver/wrong_answer": "Your final answer is not correct. Re-derive it step by step."}
SITE = [[(3, 9, "solver/wrong_answer")], []]


def _perturb(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def _by_hand(channel, student_model, teacher_model, batch) -> float:
    """The site's JSD from two plain forwards: the student's unhinted context under
    ``student_model``, the hinted one under ``teacher_model``, each through its own head."""
    (row, start, end, key), = channel.sites(batch)
    context = batch["prompt_ids"][row].tolist() + batch["completion_ids"][row][:start].tolist()
    response = batch["completion_ids"][row][start:end].tolist()
    pad = channel.trainer.processing_class.pad_token_id
    with torch.no_grad():
        student = pack_responses([context], [response], pad, torch.device("cpu"))
        teacher = pack_responses([channel.with_hint(context, key)], [response], pad, torch.device("cpu"))
        s_logits = student_model.get_output_embeddings()(response_hidden(student_model, student))
        t_logits = teacher_model.get_output_embeddings()(response_hidden(teacher_model, teacher))
    return masked_jsd_loss(s_logits, t_logits, teacher.mask, beta=0.5).item()


def test_a_base_teacher_is_the_step_zero_policy_and_live_is_the_current_one(tiny_model_dir, tmp_path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    losses = {}
    for kind in ("base", "live"):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        model.train()
        trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / kind,
                               sdpo=SDPOConfig(alpha=0.1, teacher_model_kind=kind, restate=False), hints=HINTS)
        channel = trainer.hint_distillation
        assert (channel.teacher_model is not None) is (kind == "base")  # base: a copy made at bind (step 0)
        _perturb(model, 1)  # the policy moves; a base teacher does not
        batch = make_batch(tokenizer, sites=SITE)
        losses[kind] = channel.site_loss(model, dict(batch), policy_forward=None).item()
        teacher = start if kind == "base" else model
        assert losses[kind] == pytest.approx(_by_hand(channel, model, teacher, batch), rel=1e-4, abs=1e-6)
        if kind == "base":
            assert all(torch.equal(a, b) for a, b in zip(channel.teacher_model.parameters(), start.parameters(),
                                                          strict=True))
    assert losses["base"] != pytest.approx(losses["live"], rel=1e-3)


def test_an_ema_teacher_moves_by_the_update_rate_after_each_optimizer_step(model_and_tokenizer, tiny_model_dir,
                                                                           tmp_path) -> None:
    _, tokenizer = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # its own copy: the shared fixture stays unmoved
    model.train()
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path,
                           sdpo=SDPOConfig(alpha=0.1, teacher_model_kind="ema", teacher_update_rate=0.25), hints=HINTS)
    channel = trainer.hint_distillation
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, EMATeacherCallback)]
    before = [p.detach().clone() for p in channel.teacher_model.parameters()]
    _perturb(model, 2)
    state = TrainerState()
    state.global_step = 1
    callback.on_step_end(None, state, TrainerControl(), model=model)
    for old, new, policy in zip(before, channel.teacher_model.parameters(), model.parameters(), strict=True):
        assert torch.allclose(new, 0.75 * old + 0.25 * policy.detach(), atol=1e-6)
    # the teacher's loss is the divergence to that average, through its own forward
    batch = make_batch(tokenizer, sites=SITE)
    value = channel.site_loss(model, dict(batch), policy_forward=None).item()
    assert value == pytest.approx(_by_hand(channel, model, channel.teacher_model, batch), rel=1e-4, abs=1e-6)
    # and it reaches the policy's weights only (the teacher has no gradient)
    loss = channel.site_loss(model, dict(batch), policy_forward=None)
    loss.backward()
    assert all(p.grad is None for p in channel.teacher_model.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_an_ema_teacher_is_refused_with_adapters(tiny_model_dir, model_and_tokenizer, tmp_path) -> None:
    from trainer_client.policies.adapters import attach_adapters, optimizer_groups

    _, tokenizer = model_and_tokenizer
    policies = load_config(None, None, {"policies.solver.adapter": "solver", "policies.verifier.adapter": "verifier",
                                        "policies.judge.frozen": True}).policies
    model = attach_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir), policies)
    optimizer = torch.optim.AdamW(optimizer_groups(model, policies, 1e-3))
    with pytest.raises(ValueError, match="'ema' is not wired with LoRA adapters"):
        make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, policies=policies, optimizers=(optimizer, None),
                     sdpo=SDPOConfig(alpha=0.1, teacher_model_kind="ema"), hints=HINTS)
    base = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "base", policies=policies,
                        optimizers=(optimizer, None), sdpo=SDPOConfig(alpha=0.1, teacher_model_kind="base"), hints=HINTS)
    assert base.hint_distillation.teacher_model is None  # the base with its adapters off: no copy


def _record(reward: float, episode_reward: float) -> EpisodeRewards:
    right = reward >= 1
    turn = TurnReward(t=0, role=Role.SOLVER, reward=reward, error_kind=None if right else "wrong_answer",
                      hint_template_key=None if right else "solver/wrong_answer", answer="66" if right else "56",
                      correct=right)
    facts = CounterfactualFacts(first_answer_correct=right, last_solver_answer_correct=right,
                                final_answer_correct=episode_reward >= 1, judge_correct=None, verifier_accepted=right,
                                rounds=1, local_rewards={}, rewards_without_role={}, circular_critique=False)
    return EpisodeRewards(episode_id=f"e{reward}{episode_reward}", problem_id="p", turns=[turn],
                          episode_reward=episode_reward, facts=facts, graded_at=0.0)


def test_a_successful_siblings_action_joins_the_hint_and_repaired_rollouts_can_be_left_out(model_and_tokenizer,
                                                                                          tiny_model_dir, tmp_path) -> None:
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    model, _ = model_and_tokenizer
    # what TRL 1.16's GRPOTrainer does to the tokenizer of a run with tools (environment_factory)
    tokenizer = add_response_schema(AutoTokenizer.from_pretrained(tiny_model_dir))
    config = SDPOConfig(alpha=0.1, restate=False, use_successful_as_teacher=True)
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, sdpo=config, hints=HINTS)
    channel = trainer.hint_distillation
    message = tool_call_message(Role.SOLVER, r"Ones: $4 + 2 = 6$. So the answer is $\boxed{66}$.")
    ids = tool_call_response_ids(tokenizer, message, chat_template=trainer.chat_template,
                                 eos_token_id=tokenizer.eos_token_id, template_kwargs=trainer.chat_template_kwargs)
    prompt = make_batch(tokenizer)["prompt_ids"][0].tolist()
    width = len(ids) + 2

    def batch_of(records):  # rows of one group (num_generations 2 in make_args): each row's turn 0 is its ids
        completion = torch.tensor([ids + [tokenizer.pad_token_id] * 2] * len(records))
        output = {"prompt_ids": torch.tensor([prompt] * len(records)),
                  "prompt_mask": torch.ones(len(records), len(prompt), dtype=torch.long),
                  "completion_ids": completion, "completion_mask": torch.ones(len(records), width, dtype=torch.long)}
        segments = [[Segment(0, len(ids), SegmentOwner(0, Role.SOLVER, True))] for _ in records]
        return ScoredBatch(output, records, [None] * len(records), segments, [], "train", 0)

    batch = batch_of([_record(0.0, 0.0), _record(1.0, 1.0)])
    channel.prepare(batch)
    (site,), [] = batch.output[SITES]
    expected = SUCCESSFUL_TEMPLATE.format(solution=reply_action(message, Role.SOLVER))
    assert channel.hint_text(site[2]) == f"{HINTS['solver/wrong_answer']}\n\n{expected}"
    assert channel.batch_metrics() == {"sdpo/sibling_hints": 1.0}
    # no successful sibling in the group (both wrong): the plain hint
    batch = batch_of([_record(0.0, 0.0), _record(0.0, 0.0)])
    channel.prepare(batch)
    assert [channel.hint_text(key) for row in batch.output[SITES] for *_, key in row] == [HINTS["solver/wrong_answer"]] * 2
    assert channel.batch_metrics() == {"sdpo/sibling_hints": 0.0}
    # failed_only (SRPO at the rollout level): an erring turn in a rollout that ended right is not distilled
    repaired = batch_of([_record(0.0, 1.0), _record(0.0, 0.0)])
    trainer_failed = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "failed",
                                  sdpo=SDPOConfig(alpha=0.1, restate=False, failed_only=True), hints=HINTS)
    trainer_failed.hint_distillation.prepare(repaired)
    assert [len(row) for row in repaired.output[SITES]] == [0, 1]


def test_the_teachers_advantage_at_the_right_token_is_logged_by_hand(model_and_tokenizer, tiny_model_dir,
                                                                     tmp_path) -> None:
    """``sdpo/teacher_advantage``: at a solver site, teacher minus student log-prob of the first
    token of the right turn (the reference solution as the solver's tool call) that the student
    would not choose greedily; recomputed here with plain forwards of whole sequences."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    from trainer_client.losses.replay_pairs import as_policy_writes

    model, _ = model_and_tokenizer
    tokenizer = add_response_schema(AutoTokenizer.from_pretrained(tiny_model_dir))
    solution = r"Ones: $4 + 2 = 6$. Tens: $3 + 3 = 6$. So the answer is $\boxed{66}$."
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, sdpo=SDPOConfig(alpha=0.1, restate=False),
                           hints=HINTS, reference_solution={"p": solution}.get)
    channel = trainer.hint_distillation
    batch = make_batch(tokenizer)
    output = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    segments = [[Segment(2, 8, SegmentOwner(0, Role.SOLVER, True))], []]
    scored = ScoredBatch(output, [_record(0.0, 0.0), _record(1.0, 1.0)], [None, None], segments, [], "train", 0)
    channel.prepare(scored)
    metrics = channel.batch_metrics()
    # by hand: the right turn after the student's context, and after the hinted one
    (row_sites, _) = output[SITES]
    (start, _, key), = row_sites
    context = batch["prompt_ids"][0].tolist() + batch["completion_ids"][0][:start].tolist()
    rendered = tool_call_response_ids(tokenizer, tool_call_message(Role.SOLVER, solution),
                                      chat_template=trainer.chat_template, eos_token_id=tokenizer.eos_token_id,
                                      template_kwargs=trainer.chat_template_kwargs)
    right = as_policy_writes(tokenizer, rendered, batch["completion_ids"][0][2:8].tolist())

    def logps(prefix: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prefix + right])).logits[0, len(prefix) - 1:-1].float()
        return torch.log_softmax(logits, -1)[torch.arange(len(right)), torch.tensor(right)], logits.argmax(-1)

    student, greedy = logps(context)
    teacher, _ = logps(channel.with_hint(context, key))
    first = int((greedy != torch.tensor(right)).nonzero()[0])
    assert metrics["sdpo/teacher_advantage_sites"] == 1.0
    assert metrics["sdpo/teacher_advantage"] == pytest.approx(float(teacher[first] - student[first]), abs=1e-4)
    # without reference solutions there is nothing to measure
    plain = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "plain", sdpo=SDPOConfig(alpha=0.1),
                         hints=HINTS)
    plain.hint_distillation.prepare(ScoredBatch(dict(output), scored.records, [None, None], segments, [], "train", 0))
    assert plain.hint_distillation.batch_metrics() == {}


def test_the_gate_keeps_the_sites_where_the_teacher_disagrees_with_the_error(model_and_tokenizer, tmp_path) -> None:
    """``sdpo.gate: teacher_disagrees``: a site is distilled only where the hinted teacher's mean
    log-prob of the student's own erring tokens is below the student's; the loss is the JSD over
    the kept sites' tokens alone (both recomputed here with plain forwards)."""
    model, tokenizer = model_and_tokenizer
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path,
                           sdpo=SDPOConfig(alpha=0.1, restate=False, gate="teacher_disagrees"), hints=HINTS)
    channel = trainer.hint_distillation
    batch = make_batch(tokenizer, sites=[[(3, 9, "solver/wrong_answer")], [(0, 4, "solver/wrong_answer")]])
    # turns for which the hint lowers the first site's tokens and raises the second's (found by trying seeds)
    batch["completion_ids"] = torch.randint(10, len(tokenizer) - 1, (2, 12), generator=torch.Generator().manual_seed(1))
    pad = tokenizer.pad_token_id
    kept, s_logits, t_logits, masks = [], [], [], []
    for row, start, end, key in channel.sites(batch):
        context = batch["prompt_ids"][row].tolist() + batch["completion_ids"][row][:start].tolist()
        own = batch["completion_ids"][row][start:end].tolist()
        with torch.no_grad():
            student = pack_responses([context], [own], pad, torch.device("cpu"))
            teacher = pack_responses([channel.with_hint(context, key)], [own], pad, torch.device("cpu"))
            s = model.get_output_embeddings()(response_hidden(model, student)).float()
            t = model.get_output_embeddings()(response_hidden(model, teacher)).float()
        gap = (torch.log_softmax(t, -1) - torch.log_softmax(s, -1)).gather(-1, torch.tensor([[own]]).transpose(1, 2))
        kept.append(float(gap.mean()) < 0)
        s_logits.append(s[0])
        t_logits.append(t[0])
        masks.append(torch.ones(len(own), dtype=torch.bool))
    value = trainer.compute_loss(model, dict(batch))
    assert value is not None
    metrics = trainer._metrics["train"]
    assert kept == [True, False] and metrics["sdpo/gate_kept"] == [1.0]
    chosen = [0]
    width = max(len(s_logits[i]) for i in chosen)

    def padded(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([torch.cat([r.new_zeros(width - len(r), *r.shape[1:]), r]) for r in rows])

    expected = masked_jsd_loss(padded([s_logits[i] for i in chosen]), padded([t_logits[i] for i in chosen]),
                               padded([masks[i] for i in chosen]), beta=0.5).item()
    assert metrics["loss/sdpo_jsd"][-1] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_the_gate_scores_a_teacher_copy_through_its_own_head(model_and_tokenizer) -> None:
    """With a ``base``/``ema`` copy the gate's teacher log-probs come from the copy's head (block
    by block through ``head_logps``), not the policy's: the same hidden states on both sides
    give a gap of exactly 0 through one head (nothing kept), and through a copy whose head is the
    policy's doubled (a sharper teacher: random tokens less likely) the by-hand full-logits gap."""
    import copy
    from types import SimpleNamespace

    from trainer_client.losses.sdpo_teacher import teacher_disagrees

    model, _ = model_and_tokenizer
    teacher_copy = copy.deepcopy(model)
    with torch.no_grad():
        teacher_copy.get_output_embeddings().weight.mul_(2.0)
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 5, model.config.hidden_size, generator=g)
    labels = torch.randint(0, model.config.vocab_size, (3, 5), generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, :2] = False
    sites = SimpleNamespace(labels=labels, mask=mask)
    assert not teacher_disagrees(model, hidden, hidden, None, sites).any()
    kept = teacher_disagrees(model, hidden, hidden, teacher_copy, sites)
    with torch.no_grad():
        def logps(head: torch.nn.Module) -> torch.Tensor:
            return torch.log_softmax(head(hidden).float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)

        gap = ((logps(teacher_copy.get_output_embeddings()) - logps(model.get_output_embeddings())) * mask).sum(-1)
    assert kept.tolist() == (gap / mask.sum(-1) < 0).tolist() and kept.any()
