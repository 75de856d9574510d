"""The three loss channels of DebateGRPOTrainer on a constructed batch (real TRL, real model)."""

from __future__ import annotations

import json
import os
import random
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trainer_batches import make_batch, make_trainer
from trl import GRPOTrainer

from env_server.protocol.markers import Role
from env_server.protocol.models import CounterfactualFacts, EpisodeRewards, TurnReward
from trainer_client.config import ReplayConfig, SDPOConfig
from trainer_client.losses.base import ScoredBatch
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.losses.teachers import Teacher, TeacherConfig, TeacherPool, TeacherReply
from trainer_client.trainer import DebateGRPOTrainer
from trainer_client.trl_compat import restore_class_forward

HINTS = {"solver/wrong_answer": "Your final answer is not correct. Re-derive it step by step."}


def test_zero_weights_equal_the_base_grpo_loss(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    base = make_trainer(GRPOTrainer, model, tokenizer, tmp_path / "base")
    ours = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "ours", sdpo=SDPOConfig(alpha=0.0),
                        replay=ReplayConfig(beta=0.0))
    batch = make_batch(tokenizer, sites=[[(3, 9, "solver/wrong_answer")], []])
    expected = base.compute_loss(model, dict(batch))
    actual = ours.compute_loss(model, dict(batch))
    assert torch.allclose(actual, expected, atol=1e-6, rtol=1e-5)
    assert ours._metrics["train"]["loss/sdpo_jsd"] == [0.0]


def count_forwards(model):
    """Count passes through the transformer body (the policy's GRPO pass, teacher passes...)."""
    calls = []
    handle = model.get_decoder().register_forward_hook(lambda *args: calls.append(1))
    return calls, handle


def test_sdpo_is_zero_without_error_sites_and_positive_with_one(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, sdpo=SDPOConfig(alpha=0.1), hints=HINTS)
    calls, handle = count_forwards(model)
    try:
        plain = trainer.compute_loss(model, make_batch(tokenizer))
        forwards_without_sites = len(calls)
        calls.clear()
        with_site = trainer.compute_loss(model, make_batch(tokenizer, sites=[[(3, 9, "solver/wrong_answer")], []]))
        forwards_with_site = len(calls)
    finally:
        handle.remove()
    sdpo = trainer._metrics["train"]["loss/sdpo_jsd"]
    assert sdpo[0] == 0.0 and sdpo[1] > 0.0
    # how much of the micro-batch the term reaches: one site of 6 tokens (completion tokens 3..9)
    assert trainer._metrics["train"]["sdpo/sites"] == [0.0, 1.0]
    assert trainer._metrics["train"]["sdpo/site_tokens"] == [0.0, 6.0]
    # only the hinted teacher costs a pass: the student side reuses GRPO's own forward
    assert forwards_without_sites == 1 and forwards_with_site == 2
    assert with_site.item() == pytest.approx(plain.item() + 0.1 * sdpo[1], rel=1e-4)
    with_site.backward()  # the SDPO term has a gradient path


def test_hint_distillation_reuses_the_grpo_forward_exactly(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, sdpo=SDPOConfig(alpha=0.1), hints=HINTS)
    batch = make_batch(tokenizer, sites=[[(3, 9, "solver/wrong_answer")], [(0, 4, "solver/wrong_answer")]])
    widths: list[int] = []
    handle = model.get_decoder().register_forward_hook(
        lambda module, args, kwargs, output: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        trainer.compute_loss(model, dict(batch))
    finally:
        handle.remove()
    reused = trainer._metrics["train"]["loss/sdpo_jsd"][-1]
    recomputed = trainer.hint_distillation.site_loss(model, dict(batch), policy_forward=None).item()
    assert reused == pytest.approx(recomputed, rel=1e-4)
    # the teacher continued from the GRPO forward's keys and values: it ran the hint and the
    # turn only, never the prompt again
    prompt = batch["prompt_ids"][0].tolist()
    row_0 = trainer.hint_distillation.hint_insertion(prompt + batch["completion_ids"][0][:3].tolist(), "solver/wrong_answer")
    row_1 = trainer.hint_distillation.hint_insertion(prompt, "solver/wrong_answer")  # the turn starts the completion
    assert row_1[0] < len(prompt)  # the generation prompt gave way to the hint's user message
    assert widths == [len(prompt) + 12, max(len(row_0[1]) + 6, len(row_1[1]) + 4) - 1]


def test_hint_is_inserted_as_a_user_message_before_the_turn(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, sdpo=SDPOConfig(alpha=0.1), hints=HINTS)
    context = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}], add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    hinted = tokenizer.decode(trainer.hint_distillation.with_hint(list(context), "solver/wrong_answer"))
    assert hinted == tokenizer.decode(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Q"}, {"role": "user", "content": HINTS["solver/wrong_answer"]}],
        add_generation_prompt=True, tokenize=True, return_dict=False))


def test_replay_dpo_term_uses_stored_pairs(model_and_tokenizer, tmp_path) -> None:
    model, tokenizer = model_and_tokenizer
    store = PairStore(tmp_path / "pairs.jsonl")
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, replay=ReplayConfig(beta=0.05, pairs_per_step=2),
                           teacher_pool=object(), pair_store=store)
    trainer.compute_loss(model, make_batch(tokenizer))
    assert trainer._metrics["train"]["loss/trace_replay_dpo"] == [0.0]  # no pairs yet: no term
    context = tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 times 7?"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    chosen_ids, rejected_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                                for text in (r"It is \boxed{42}.", r"It is \boxed{41}."))
    pair = DpoPair(prompt_messages=[{"role": "user", "content": "What is 6 times 7?"}], chosen=r"It is \boxed{42}.",
                   rejected=r"It is \boxed{41}.", episode_id="e", t=0, role="solver", teacher="oracle", created_step=0,
                   context_ids=list(context), chosen_ids=chosen_ids, rejected_ids=rejected_ids)
    with torch.no_grad():
        ref_chosen, ref_rejected = trainer.trace_replay.pair_logps(model, [pair])
    pair.ref_chosen_logp, pair.ref_rejected_logp = ref_chosen.item(), ref_rejected.item()
    store.add([pair])
    loss = trainer.compute_loss(model, make_batch(tokenizer))
    dpo = trainer._metrics["train"]["loss/trace_replay_dpo"][-1]
    # the policy equals the reference: the margin is 0 and the loss is log 2
    assert dpo == pytest.approx(0.6931, abs=1e-3)
    loss.backward()


def make_pair(trainer, tokenizer, chosen: str, rejected: str, episode_id: str) -> DpoPair:
    """A scorable pair on a chat context, its reference log-probs taken under ``trainer.model``."""
    context = tokenizer.apply_chat_template([{"role": "user", "content": "What is 6 times 7?"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    chosen_ids, rejected_ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                                for text in (chosen, rejected))
    pair = DpoPair(prompt_messages=[{"role": "user", "content": "What is 6 times 7?"}], chosen=chosen, rejected=rejected,
                   episode_id=episode_id, t=0, role="solver", teacher="oracle", created_step=0,
                   context_ids=list(context), chosen_ids=chosen_ids, rejected_ids=rejected_ids)
    with torch.no_grad():
        ref_chosen, ref_rejected = trainer.trace_replay.pair_logps(trainer.model, [pair])
    # an offset reference, so each pair's margin (and its loss) differs from log 2
    pair.ref_chosen_logp, pair.ref_rejected_logp = ref_chosen.item() + 3.0, ref_rejected.item() - 1.0
    return pair


def test_replay_pairs_per_step_do_not_depend_on_gradient_accumulation(model_and_tokenizer, tmp_path) -> None:
    """``pairs_per_step`` pairs are drawn once per optimiser step and dealt over its micro-batches:
    the summed gradient of the micro-batches' terms (each divided by the accumulation, as
    ``compute_loss`` does) equals the gradient of the mean DPO loss over the same pairs in one
    micro-batch, and a micro-batch left without a share adds nothing and logs nothing."""
    model, tokenizer = model_and_tokenizer
    store = PairStore(tmp_path / "pairs.jsonl")
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, replay=ReplayConfig(beta=0.05, pairs_per_step=3),
                           teacher_pool=object(), pair_store=store)
    store.add([make_pair(trainer, tokenizer, r"It is \boxed{42}.", r"It is \boxed{41}.", "a"),
               make_pair(trainer, tokenizer, r"So \boxed{42}", r"So \boxed{40}", "b"),
               make_pair(trainer, tokenizer, r"42, so \boxed{42}.", r"\boxed{7}", "c")])
    params = [p for p in model.parameters() if p.requires_grad]

    def gradient(loss: torch.Tensor) -> list[torch.Tensor]:
        return [g.clone() for g in torch.autograd.grad(loss, params, allow_unused=True, retain_graph=False)
                if g is not None]

    trainer.state.global_step = 7
    drawn = []
    original_sample = store.sample
    store.sample = lambda n, rng, **kwargs: drawn.append(original_sample(n, rng, **kwargs)) or drawn[-1]
    shares = [trainer.trace_replay.share_loss(model, "train", 2) for _ in range(2)]
    assert len(drawn) == 1 and len(drawn[0]) == 3  # one draw for the step, all three pairs
    (first, first_logged), (second, second_logged) = shares
    assert first is not None and second is not None
    accumulated = gradient(first / 2 + second / 2)
    whole = gradient(trainer.trace_replay.dpo_loss(model, drawn[0]))
    assert len(accumulated) == len(whole) > 0
    for a, b in zip(accumulated, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # logged: each micro-batch's own mean (2 pairs, then 1), never the scaled term
    losses = [trainer.trace_replay.dpo_loss(model, [p]).item() for p in drawn[0]]
    assert first_logged == pytest.approx((losses[0] + losses[2]) / 2, rel=1e-4)
    assert second_logged == pytest.approx(losses[1], rel=1e-4)

    # fewer pairs than micro-batches: the later micro-batches add no term and log nothing
    trainer.replay.pairs_per_step = 1
    trainer.state.global_step = 8
    shares = [trainer.trace_replay.share_loss(model, "train", 3) for _ in range(3)]
    assert len(drawn) == 2 and len(drawn[1]) == 1
    expected = trainer.trace_replay.dpo_loss(model, drawn[1]).item()
    assert shares[0][0] is not None and shares[0][1] == pytest.approx(expected, rel=1e-4)
    assert shares[1] == (None, None) and shares[2] == (None, None)
    # the next optimiser step draws again
    trainer.state.global_step = 9
    trainer.trace_replay.share_loss(model, "train", 3)
    assert len(drawn) == 3


# ---------------------------------------------------------------------------- replay pairs on the rollout's tokens


class ScriptedTeacher(Teacher):
    """Answers the solver's and the verifier's replayed states (both teachers agree)."""

    def respond(self, messages, problem_id) -> TeacherReply:
        if "[VERIFIER]" in messages[-1]["content"]:
            return TeacherReply("Step 2 is wrong.\n\nVERDICT: INCORRECT")
        return TeacherReply(r"The answer is \boxed{42}.")


def tool_call(name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def generated(tokenizer, message: dict) -> list[int]:
    """A tool call as the tiny model generates it (its warm-up format) and its end-of-turn token."""
    function = message["tool_calls"][0]["function"]
    arguments = json.dumps(function["arguments"])
    text = '<tool_call>\n{"name": "' + function["name"] + '", "arguments": ' + arguments + "}\n</tool_call>"
    return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


def tool_suffix(tokenizer, template, tool_message: dict) -> list[int]:
    """What TRL 1.16 appends after a tool call (``GRPOTrainer._get_tool_suffix_ids``)."""
    dummy = [{"role": "user", "content": "dummy"}, tool_call(tool_message["name"], {})]
    prefix = list(tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False, chat_template=template))
    full = list(tokenizer.apply_chat_template([*dummy, tool_message], add_generation_prompt=True, tokenize=True,
                                              return_dict=False, chat_template=template))
    prefix = prefix[: len(prefix) - prefix[::-1].index(tokenizer.eos_token_id)]
    return full[len(prefix):]


def hand_built_rollout(tokenizer, template, problem: str, solver_answer: str) -> dict:
    """One debate laid out as TRL's tool loop lays it out: the prompt (with the tools), then the
    solver's call, its tool result, the verifier's call, its tool result."""
    from trainer_client.rollout.tool_calls import tool_callables
    from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT
    from trainer_client.rollout.trace import TurnLog

    prompt = [{"role": "system", "content": DEBATE_SYSTEM_PROMPT}, {"role": "user", "content": f"[SOLVER] {problem}"}]
    prompt_ids = list(tokenizer.apply_chat_template(prompt, tools=tool_callables(), add_generation_prompt=True,
                                                    tokenize=True, return_dict=False, chat_template=template))
    calls = [tool_call("submit_solution", {"solution": rf"So \boxed{{{solver_answer}}}"}),
             tool_call("submit_verdict", {"verdict": "CORRECT", "critique": "Fine."})]
    returned = ["[VERIFIER] Check the solution.", "[JUDGE] Give the final answer."]
    completion, model_tokens, messages = [], [], []
    for call, text in zip(calls, returned, strict=True):
        tool_message = {"role": "tool", "name": call["tool_calls"][0]["function"]["name"], "content": text}
        own, suffix = generated(tokenizer, call), tool_suffix(tokenizer, template, tool_message)
        completion += own + suffix
        model_tokens += [1] * len(own) + [0] * len(suffix)
        messages += [call, tool_message]
    turns = [TurnLog(0, Role.SOLVER, "tool", returned[0]), TurnLog(1, Role.VERIFIER, "tool", returned[1])]
    contents = [rf"So \boxed{{{solver_answer}}}", "Fine.\n\nVERDICT: CORRECT"]
    return {"prompt": prompt, "prompt_ids": prompt_ids, "completion_ids": completion, "model_tokens": model_tokens,
            "messages": messages, "turns": turns, "contents": contents}


def fake_environment(rollout: dict):
    from env_server.protocol.models import Message

    states = [[Message(role="user", content="[SOLVER] solve it")], [Message(role="user", content="[VERIFIER] check it")]]
    transcript = [SimpleNamespace(content=c) for c in rollout["contents"]]
    trace = SimpleNamespace(observation=SimpleNamespace(transcript=transcript),
                            state_at=lambda t: SimpleNamespace(messages=states[t]))
    return SimpleNamespace(trace=trace)


def record(episode_id: str, solver_answer: str) -> EpisodeRewards:
    facts = CounterfactualFacts(first_answer_correct=False, last_solver_answer_correct=False, final_answer_correct=False,
                                judge_correct=None, verifier_accepted=True, rounds=1, local_rewards={},
                                rewards_without_role={})
    return EpisodeRewards(episode_id=episode_id, problem_id="p", episode_reward=0.0, facts=facts, graded_at=0.0, turns=[
        TurnReward(t=0, role=Role.SOLVER, reward=0.0, answer=solver_answer, correct=False),
        TurnReward(t=1, role=Role.VERIFIER, reward=0.0, answer="CORRECT", correct=False)])


def test_replay_pairs_are_built_on_the_rollouts_tokens_and_the_roles_tool_call(model_and_tokenizer, tmp_path) -> None:
    """Context: the policy's prompt + completion ids before the turn's segment; rejected: the
    segment's ids; chosen: the teacher's response as the role's tool call in the training template."""
    from trl.chat_template_utils import get_training_chat_template

    from trainer_client.losses.trace_replay import replay_pair_logps
    from trainer_client.rollout.segments import completion_segments
    from trainer_client.rollout.tool_calls import tool_callables

    model, tokenizer = model_and_tokenizer
    # what GRPOTrainer trains tool rollouts with (the tiny model's qwen3 template is not prefix-preserving)
    template = get_training_chat_template(tokenizer)
    pool = TeacherPool([ScriptedTeacher(TeacherConfig(name=n, kind="hf", model="unused")) for n in ("a", "b")],
                       equivalent=lambda a, b: a == b)
    store = PairStore(tmp_path / "pairs.jsonl")
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, teacher_pool=pool, pair_store=store,
                           replay=ReplayConfig(beta=0.05, roles=[Role.SOLVER, Role.VERIFIER]))
    trainer.chat_template = template  # as GRPOTrainer sets it when it trains with tools
    rollouts = [hand_built_rollout(tokenizer, template, "What is 6 times 7?", "41"),
                hand_built_rollout(tokenizer, template, "What is the sum of the first ten positive integers?", "54")]
    pad = tokenizer.pad_token_id
    width = max(len(r["prompt_ids"]) for r in rollouts)
    length = max(len(r["completion_ids"]) for r in rollouts)
    output = {  # TRL's layout: prompts left-padded, completions right-padded
        "prompt_ids": torch.tensor([[pad] * (width - len(r["prompt_ids"])) + r["prompt_ids"] for r in rollouts]),
        "prompt_mask": torch.tensor([[0] * (width - len(r["prompt_ids"])) + [1] * len(r["prompt_ids"]) for r in rollouts]),
        "completion_ids": torch.tensor([r["completion_ids"] + [pad] * (length - len(r["completion_ids"])) for r in rollouts]),
    }
    assert output["prompt_mask"][0].tolist() != output["prompt_mask"][1].tolist()  # one prompt is padded
    segments = [completion_segments(r["messages"], r["turns"], r["model_tokens"]) for r in rollouts]
    assert all(s is not None and len(s) == 2 for s in segments)
    records = [record("e0", "41"), record("e1", "54")]
    try:
        trainer.trace_replay.submit_replays(ScoredBatch(output, records, [fake_environment(r) for r in rollouts], segments, [],
                                                             "train", 0))
        pool.wait(timeout_s=30)
        trainer.trace_replay.store_new_pairs()
    finally:
        pool.close()
    pairs = {(p.episode_id, p.t): p for p in store.sample(10, random.Random(0))}
    assert sorted(pairs) == [("e0", 0), ("e0", 1), ("e1", 0), ("e1", 1)]
    for k, rollout in enumerate(rollouts):
        for segment in segments[k]:
            pair = pairs[(f"e{k}", segment.owner.t)]
            assert pair.context_ids == rollout["prompt_ids"] + rollout["completion_ids"][: segment.start]
            assert pair.rejected_ids == rollout["completion_ids"][segment.start: segment.end]
            assert pair.rejected == rollout["contents"][segment.owner.t]  # the texts stay, for humans
            assert pair.chosen_ids[-1] == tokenizer.eos_token_id and not pair.gold_supervised
        solver, verifier = (tokenizer.decode(pairs[(f"e{k}", t)].chosen_ids) for t in (0, 1))
        # in the policy's own format: its messages (the rejected sides) start with the tool call, so
        # the empty <think> block the template renders before an assistant message is left out
        assert solver == ('<tool_call>\n{"name": "submit_solution", "arguments": '
                          '{"solution": "The answer is \\\\boxed{42}."}}\n</tool_call><|im_end|>')
        assert "submit_verdict" in verifier and '"verdict": "INCORRECT", "critique": "Step 2 is wrong."' in verifier
        # the first turn's pair is exactly the template's rendering of the conversation had the
        # policy called submit_solution with the teacher's text (less the empty reasoning block,
        # up to the template's trailing newline)
        pair = pairs[(f"e{k}", 0)]
        full = tokenizer.apply_chat_template(
            [*rollout["prompt"], tool_call("submit_solution", {"solution": r"The answer is \boxed{42}."})],
            tools=tool_callables(), tokenize=True, return_dict=False, chat_template=template)
        block = tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
        assert list(full) == (pair.context_ids + block + pair.chosen_ids
                              + tokenizer("\n", add_special_tokens=False)["input_ids"])
    # reference log-probs are those of the rejected tokens given the context under the (unchanged) policy
    pair = pairs[("e1", 1)]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([pair.context_ids + pair.rejected_ids])).logits[0]
        steps = torch.log_softmax(logits[len(pair.context_ids) - 1: -1], dim=-1)
        expected = steps.gather(-1, torch.tensor(pair.rejected_ids)[:, None]).sum().item()
        chosen, rejected = replay_pair_logps(model, [pair], pad_token_id=pad, device="cpu",
                                             max_completion_length=trainer.max_completion_length)
    assert pair.ref_rejected_logp == pytest.approx(expected, rel=1e-4, abs=1e-4)
    assert (chosen.item(), rejected.item()) == pytest.approx((pair.ref_chosen_logp, pair.ref_rejected_logp), rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("rpo_alpha", [0.0, 1.0])
def test_replay_steps_raise_the_chosen_side_not_only_the_margin(model_and_tokenizer, tmp_path, rpo_alpha) -> None:
    """A few optimizer steps on the replay term: the margin grows either way; with RPO's NLL term
    (``replay.rpo_alpha``, the default) the chosen side's own log-probability rises too, and the
    held-out pairs' monitor reports it (``replay/heldout/*``)."""
    import copy

    model, tokenizer = model_and_tokenizer
    model = copy.deepcopy(model)
    restore_class_forward(model)  # an earlier trainer patched the shared model's forward; the copy must run itself
    store = PairStore(tmp_path / "pairs.jsonl")
    config = ReplayConfig(beta=1.0, dpo_beta=0.1, pairs_per_step=2, rpo_alpha=rpo_alpha, heldout_pair_share=0.0)
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path, replay=config, teacher_pool=object(),
                           pair_store=store)
    replay = trainer.trace_replay
    pairs = [make_pair(trainer, tokenizer, r"It is \boxed{42}.", r"It is \boxed{41}.", "a"),
             make_pair(trainer, tokenizer, r"So \boxed{42}", r"So \boxed{40}", "b")]
    for p in pairs:  # the reference is the starting policy itself
        with torch.no_grad():
            c, r = replay.pair_logps(model, [p])
        p.ref_chosen_logp, p.ref_rejected_logp = c.item(), r.item()

    def logps() -> tuple[float, float]:
        with torch.no_grad():
            chosen, rejected = replay.pair_logps(model, pairs)
        return chosen.sum().item(), rejected.sum().item()

    chosen_0, rejected_0 = logps()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(5):
        optimizer.zero_grad()
        replay.dpo_loss(model, pairs).backward()
        optimizer.step()
    chosen_5, rejected_5 = logps()
    assert chosen_5 - rejected_5 > chosen_0 - rejected_0 + 1.0  # the margin grew
    if rpo_alpha > 0:
        assert chosen_5 > chosen_0 + 1.0, (chosen_0, chosen_5)  # and the chosen side itself rose
    logged = replay._pending_metrics
    assert set(logged) == {"replay/chosen_logp", "replay/rejected_logp", "replay/margin"}

    # the monitor: pairs held out of training (share 1.0 here: all of them) under the current policy
    store.add(pairs)
    replay.config = config.model_copy(update={"heldout_pair_share": 0.999})
    monitored = replay.monitor(model)
    assert monitored["replay/heldout/pairs"] == 2.0 and monitored["replay/heldout/accuracy"] == 1.0
    assert monitored["replay/heldout/chosen_logp"] == pytest.approx(chosen_5 / 2, rel=1e-4)
    assert replay.pair_store.sample(2, random.Random(0), heldout_share=0.999) == []  # never trained on


def test_srpo_routing_takes_the_distilled_sites_out_of_the_grpo_mask(model_and_tokenizer, tmp_path) -> None:
    """``sdpo.route`` (SRPO's sample routing, arXiv 2604.02288): the tokens of every error site
    the term distils leave the GRPO loss mask (0), all others stay (1); without it, no mask (the
    trainer multiplies a channel's mask into the GRPO loss mask in ``on_scored_batch``)."""
    from trainer_client.rollout.segments import Segment, SegmentOwner

    model, tokenizer = model_and_tokenizer
    turns = [TurnReward(t=0, role=Role.SOLVER, reward=0.0, error_kind="wrong_answer",
                        hint_template_key="solver/wrong_answer", answer="37", correct=False),
             TurnReward(t=1, role=Role.VERIFIER, reward=1.0, error_kind=None, hint_template_key=None, answer=None,
                        correct=True),
             TurnReward(t=2, role=Role.SOLVER, reward=0.0, error_kind="wrong_answer",
                        hint_template_key="solver/wrong_answer", answer="38", correct=False)]
    facts = CounterfactualFacts(first_answer_correct=False, last_solver_answer_correct=False,
                                final_answer_correct=False, judge_correct=None, verifier_accepted=False, rounds=2,
                                local_rewards={}, rewards_without_role={}, circular_critique=False)
    wrong = EpisodeRewards(episode_id="e", problem_id="p", turns=turns, episode_reward=0.0, facts=facts, graded_at=0.0)
    right = wrong.model_copy(update={"turns": [turns[1].model_copy(update={"t": 0})], "episode_reward": 1.0})
    segments = [[Segment(1, 4, SegmentOwner(0, Role.SOLVER, True)), Segment(4, 6, SegmentOwner(1, Role.VERIFIER, True)),
                 Segment(7, 9, SegmentOwner(2, Role.SOLVER, True))],
                [Segment(0, 3, SegmentOwner(0, Role.VERIFIER, True))]]
    for route in (False, True):
        trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / str(route),
                               sdpo=SDPOConfig(alpha=0.1, route=route, restate=False), hints=HINTS)
        output: dict = {"completion_mask": torch.ones(2, 10, dtype=torch.long)}
        mask = trainer.hint_distillation.prepare(ScoredBatch(output, [wrong, right], [None, None], segments, [], "train", 0))
        if not route:
            assert mask is None
            continue
        assert mask.dtype == torch.long
        assert mask.tolist() == [[1, 0, 0, 0, 1, 1, 1, 0, 0, 1],  # the two erring solver turns, 1:4 and 7:9
                                 [1] * 10]  # the correct rollout: all GRPO


def test_a_localised_hint_replaces_the_template_in_the_teacher_context(model_and_tokenizer, tmp_path) -> None:
    """The rewards record's own hint for a turn (RFC 0002 "Localised hints") is what the teacher
    sees, under a key that keeps the erring role; ``hint: template`` keeps the template;
    ``hint: reference`` (OPSD) shows the reference solution, and needs the solutions."""
    from trainer_client.losses.hint_distillation import SITES
    from trainer_client.rollout.segments import Segment, SegmentOwner

    model, tokenizer = model_and_tokenizer
    localised = "Your final answer is not correct: the ones column is wrong (Ones: $4 + 2$)."
    turns = [TurnReward(t=0, role=Role.SOLVER, reward=0.0, error_kind="wrong_answer",
                        hint_template_key="solver/wrong_answer", answer="37", correct=False, hint=localised),
             TurnReward(t=1, role=Role.VERIFIER, reward=0.0, error_kind="false_accept",
                        hint_template_key="verifier/false_accept", answer=None, correct=False)]
    facts = CounterfactualFacts(first_answer_correct=False, last_solver_answer_correct=False,
                                final_answer_correct=False, judge_correct=None, verifier_accepted=True, rounds=1,
                                local_rewards={}, rewards_without_role={}, circular_critique=False)
    record = EpisodeRewards(episode_id="e", problem_id="gen/two_digit_sum/1", turns=turns, episode_reward=0.0,
                            facts=facts, graded_at=0.0)
    segments = [[Segment(0, 5, SegmentOwner(0, Role.SOLVER, True)), Segment(5, 9, SegmentOwner(1, Role.VERIFIER, True))]]
    hints = {**HINTS, "verifier/false_accept": "The answer you accepted is wrong."}
    context = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}], add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    solutions = {"gen/two_digit_sum/1": r"Ones: $4 + 2 = 6$. So the answer is $\boxed{66}$."}
    expected = {"localised": localised, "template": HINTS["solver/wrong_answer"],
                "reference": f"A correct solution: {solutions['gen/two_digit_sum/1']}"}
    for style, shown in expected.items():
        trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / style,
                               sdpo=SDPOConfig(alpha=0.1, hint=style, restate=False), hints=hints,
                               reference_solution=solutions.get)
        output: dict = {}
        trainer.hint_distillation.prepare(ScoredBatch(output, [record], [None], segments, [], "train", 0))
        (solver_site, verifier_site), = output[SITES]
        assert verifier_site == (5, 9, "verifier/false_accept")
        key = solver_site[2]
        assert solver_site[:2] == (0, 5) and key.partition("/")[0] == "solver"
        assert (key != "solver/wrong_answer") is (style != "template") and trainer.hint_distillation.hint_text(key) == shown
        assert tokenizer.decode(trainer.hint_distillation.with_hint(list(context), key)) == tokenizer.decode(
            tokenizer.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "user", "content": shown}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False))
    assert {"solver/wrong_answer": HINTS["solver/wrong_answer"]} == HINTS  # the caller's table is not changed
    with pytest.raises(ValueError, match="reference solutions"):
        make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "none", sdpo=SDPOConfig(alpha=0.1, hint="reference"),
                     hints=hints)
    # restated: the hint message ends with the instructions the erring turn's role was shown
    from trainer_client.rollout.trace import TurnLog

    environment = SimpleNamespace(trace=SimpleNamespace(turns=[
        TurnLog(0, Role.SOLVER, "tool", None, "[SOLVER] Compute $24 + 42$."),
        TurnLog(1, Role.VERIFIER, "tool", None, "[VERIFIER] Review.")]))
    trainer = make_trainer(DebateGRPOTrainer, model, tokenizer, tmp_path / "restate",
                           sdpo=SDPOConfig(alpha=0.1, restate=True), hints=hints)
    output = {}
    trainer.hint_distillation.prepare(ScoredBatch(output, [record], [environment], segments, [], "train", 0))
    (solver_site, verifier_site), = output[SITES]
    assert trainer.hint_distillation.hint_text(solver_site[2]) == f"{localised}\n\n[SOLVER] Compute $24 + 42$."
    assert trainer.hint_distillation.hint_text(verifier_site[2]) == f"{hints['verifier/false_accept']}\n\n[VERIFIER] Review."
