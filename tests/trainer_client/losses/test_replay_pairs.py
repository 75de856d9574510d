"""Replay pairs in the policy's format: the teacher's response as the role's tool call, rendered
by the training chat template (the offline tiny model's tokenizer); the rollout's own tokens as
context and rejected side; pairs of the older text-only format."""

from __future__ import annotations

import logging
import random

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

from env_server.protocol.markers import Role
from trainer_client.losses.pair_store import DpoPair, PairStore
from trainer_client.losses.replay_pairs import (
    cap_response,
    rollout_pair_ids,
    tool_call_message,
    tool_call_response_ids,
    verdict_and_critique,
)


@pytest.fixture(scope="module")
def tokenizer_and_template(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # trl 1.16: what GRPOTrainer trains tool rollouts with (its own when the tokenizer's is not prefix-preserving)
    template = None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)
    return tokenizer, template


def call(name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def test_each_role_gets_its_tool_with_the_teachers_content() -> None:
    assert tool_call_message(Role.SOLVER, r"So \boxed{42}.") == call("submit_solution", {"solution": r"So \boxed{42}."})
    assert tool_call_message(Role.VERIFIER, "Step 2 is wrong.\n\n**VERDICT: INCORRECT**") == call(
        "submit_verdict", {"verdict": "INCORRECT", "critique": "Step 2 is wrong."})
    assert tool_call_message(Role.JUDGE, r"The answer is $\boxed{\frac{1}{2}}$.") == call(
        "submit_final_answer", {"answer": r"\frac{1}{2}"})
    assert tool_call_message(Role.VERIFIER, "looks fine") is None  # no verdict: nothing to submit
    assert tool_call_message(Role.JUDGE, "no box") is None
    # the last marker wins (as the server reads it); text around an inline marker stays in the critique
    assert verdict_and_critique("Check.\nVERDICT: CORRECT\nNo, wait. VERDICT: incorrect") == (
        "INCORRECT", "Check.\nNo, wait.")


def test_chosen_ids_are_the_templates_tool_call_message_after_the_generation_prompt(tokenizer_and_template) -> None:
    tokenizer, template = tokenizer_and_template
    ids = tool_call_response_ids(tokenizer, tool_call_message(Role.SOLVER, r"The answer is \boxed{42}."),
                                 chat_template=template, eos_token_id=tokenizer.eos_token_id)
    # Qwen3's training template always writes the (empty) think block; the message ends, like a
    # generated one, with the end-of-turn token (the template's newline after it is the next message's)
    assert tokenizer.decode(ids) == ('<think>\n\n</think>\n\n<tool_call>\n{"name": "submit_solution", "arguments": '
                                     '{"solution": "The answer is \\\\boxed{42}."}}\n</tool_call><|im_end|>')
    assert ids[-1] == tokenizer.eos_token_id
    # appended to a rendered context ending with the generation prompt, it is the template's own rendering
    prompt = [{"role": "system", "content": "Play every role."}, {"role": "user", "content": "What is 6 times 7?"}]
    kwargs = {"chat_template": template, "tokenize": True, "return_dict": False}
    context = list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **kwargs))
    full = list(tokenizer.apply_chat_template([*prompt, tool_call_message(Role.SOLVER, r"The answer is \boxed{42}.")],
                                              **kwargs))
    assert full[: len(context) + len(ids)] == context + ids and tokenizer.decode(full[len(context) + len(ids):]) == "\n"
    # chat_template_kwargs reach the template: without thinking, no think block
    plain = tool_call_response_ids(tokenizer, tool_call_message(Role.SOLVER, "x"), chat_template=template,
                                   eos_token_id=tokenizer.eos_token_id, template_kwargs={"enable_thinking": False})
    assert tokenizer.decode(plain).startswith("<tool_call>\n")


def test_a_template_that_is_not_prefix_preserving_is_refused(tokenizer_and_template) -> None:
    tokenizer, _ = tokenizer_and_template
    odd = "{% for m in messages %}{{ m.role }}{% endfor %}{% if add_generation_prompt %}<GEN>{% endif %}"
    with pytest.raises(ValueError, match="prefix-preserving"):
        tool_call_response_ids(tokenizer, tool_call_message(Role.SOLVER, "x"), chat_template=odd, eos_token_id=None)


def test_rollout_pair_ids_cut_the_rollout_at_the_segment() -> None:
    context, response = rollout_pair_ids([0, 0, 7, 8], [0, 0, 1, 1], [11, 12, 13, 14, 15, 0], 2, 4)
    assert (context, response) == ([7, 8, 11, 12], [13, 14])
    assert cap_response([1, 2, 3, 4, 9], 3) == [1, 2, 9] and cap_response([1, 2], 3) == [1, 2]


def legacy_line(i: int) -> str:
    return ('{"prompt_messages": [{"role": "user", "content": "q"}], "chosen": "c", "rejected": "r", '
            f'"episode_id": "old{i}", "t": 0, "role": "solver", "teacher": "oracle", "created_step": 0, '
            '"ref_chosen_logp": -1.0, "ref_rejected_logp": -2.0}\n')


def test_pairs_without_token_ids_load_but_are_never_sampled(tmp_path, caplog) -> None:
    from trainer_client.losses.trace_replay import replay_pair_logps

    path = tmp_path / "pairs.jsonl"
    path.write_text(legacy_line(0) + legacy_line(1))
    new = DpoPair(prompt_messages=[{"role": "user", "content": "q"}], chosen="c", rejected="r", episode_id="new", t=0,
                  role="solver", teacher="oracle", created_step=1, context_ids=[1, 2], chosen_ids=[3], rejected_ids=[4],
                  ref_chosen_logp=-1.0, ref_rejected_logp=-2.0)
    with caplog.at_level(logging.WARNING, logger="trainer_client.losses.pair_store"):
        store = PairStore(path)
        store.add([new])
        store.add([DpoPair.model_validate_json(legacy_line(2))])
    assert len(store) == 4
    assert [p.episode_id for p in store.sample(10, random.Random(0))] == ["new"]
    warnings = [r for r in caplog.records if "no token ids" in r.getMessage()]
    assert len(warnings) == 1 and "2 pair(s)" in warnings[0].getMessage()  # one warning per store
    assert [p.episode_id for p in PairStore(path).sample(10, random.Random(0))] == ["new"]  # the file round-trips
    with pytest.raises(ValueError, match="no token ids"):
        legacy = DpoPair.model_validate_json(legacy_line(0))
        replay_pair_logps(None, [legacy], pad_token_id=0, max_completion_length=8, device="cpu")  # fails before the model is used


def test_the_chosen_side_takes_the_policys_own_format_for_an_empty_reasoning_block(tokenizer_and_template) -> None:
    """The template renders a chosen tool call with an empty ``<think>`` block; a policy whose own
    message (the rejected side) starts with its tool call gets the chosen side without the block
    (it never writes one: left in, DPO taught the block); a policy that writes ``<think>`` keeps it."""
    from trainer_client.losses.replay_pairs import as_policy_writes

    tokenizer, template = tokenizer_and_template
    rendered = tool_call_response_ids(tokenizer, tool_call_message(Role.SOLVER, r"So \boxed{42}."),
                                      chat_template=template, eos_token_id=tokenizer.eos_token_id)
    own = tokenizer('<tool_call>\n{"name": "submit_solution", "arguments": {"solution": "41"}}\n</tool_call>',
                    add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    chosen = as_policy_writes(tokenizer, rendered, own)
    assert tokenizer.decode(chosen).startswith("<tool_call>\n") and chosen == rendered[-len(chosen):]
    thinking = tokenizer("<think>\nHm.\n</think>\n\n", add_special_tokens=False)["input_ids"] + own
    assert as_policy_writes(tokenizer, rendered, thinking) == rendered
