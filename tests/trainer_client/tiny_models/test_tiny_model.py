"""The offline tiny model: loads without a hub, uses TRL's template, emits tool calls."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.chat_template_utils import add_response_schema, parse_response

from trainer_client.rollout.tool_calls import tool_callables
from trainer_client.tiny_models.build import build_tiny_model, rollout_tokens
from trainer_client.tiny_models.recipes import default_spec
from trainer_client.tiny_models.warmup_debates import synthetic_debates


def test_loads_offline_with_trls_template(tiny_model_dir, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert tokenizer.chat_template == (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    assert add_response_schema(tokenizer).response_template is not None  # TRL recognises it: tool calls parse
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.config.max_position_embeddings >= 4096
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


def test_the_build_is_cached(tiny_model_dir) -> None:
    start = time.perf_counter()
    assert build_tiny_model(tiny_model_dir) == Path(tiny_model_dir)
    assert time.perf_counter() - start < 5  # reused, not rebuilt


def test_synthetic_debates_are_deterministic() -> None:
    assert synthetic_debates(5, seed=3) == synthetic_debates(5, seed=3)
    assert synthetic_debates(5, seed=3) != synthetic_debates(5, seed=4)


def test_it_calls_the_right_tool_most_of_the_time(tiny_model_dir) -> None:
    tokenizer = add_response_schema(AutoTokenizer.from_pretrained(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tools = tool_callables()
    torch.manual_seed(0)
    hits = {"submit_solution": 0, "submit_verdict": 0}
    debates = synthetic_debates(12, seed=default_spec()["seed"] + 99)  # problems the warm-up never saw
    for debate in debates:
        prompt = list(tokenizer.apply_chat_template(debate[:2], tools=tools, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False))
        verifier_context, _ = rollout_tokens(tokenizer, debate[:4], tools)
        for expected, context in (("submit_solution", prompt), ("submit_verdict", verifier_context)):
            out = model.generate(torch.tensor([context]), do_sample=True, temperature=1.0, max_new_tokens=60,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            parsed = parse_response(tokenizer, out[0, len(context):].tolist(), prefix=context, tools=tools)
            calls = parsed.get("tool_calls") or []
            hits[expected] += bool(calls) and calls[0]["function"]["name"] == expected
    assert hits["submit_solution"] >= 6 and hits["submit_verdict"] >= 6, hits  # most of 12


def test_warm_up_layout_is_trls_rollout_layout() -> None:
    """A warm-up debate's token ids are what TRL's tool loop builds for the same turns: the
    prompt, then per turn the model's call and trl 1.16's own ``GRPOTrainer._get_tool_suffix_ids``
    (a TRL internal, called here on a stand-in for the trainer with the attributes it reads).
    Before the fix the warm-up rendered suffixes with the tokenizer's ``qwen3.jinja`` instead of
    TRL's training template and dropped ``<|im_start|>user\\n<tool_response>`` from every tool
    result, so every turn after the first was laid out as no rollout ever is."""
    from types import SimpleNamespace

    from trl.chat_template_utils import get_training_chat_template

    from trainer_client.tiny_models.build import SPECIAL_TOKENS, _train_tokenizer

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer = _train_tokenizer(SPECIAL_TOKENS, 300, template)
    trainer = SimpleNamespace(processing_class=tokenizer, _tokenizer=tokenizer, _is_vlm=False, chat_template_kwargs={},
                              chat_template=get_training_chat_template(tokenizer))
    tools = tool_callables()
    debate = synthetic_debates(1, seed=5, max_rounds=2, answer_accuracy=0.0)[0]  # wrong answer: two rounds
    expected = list(tokenizer.apply_chat_template(debate[:2], tools=tools, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False, chat_template=trainer.chat_template))
    tool_results = 0
    for message in debate[2:]:
        if message["role"] == "tool":
            expected += trl.GRPOTrainer._get_tool_suffix_ids(trainer, [message])
            tool_results += 1
        else:
            expected += _own_tokens(tokenizer, message)
    ids, mask = rollout_tokens(tokenizer, debate, tools)
    assert ids == expected
    assert tokenizer.decode(ids).count("<|im_start|>user\n<tool_response>") == tool_results >= 3
    assert len(mask) == len(ids)


def _own_tokens(tokenizer, message: dict) -> list[int]:
    """The model's own tokens for a message as it generates them (qwen3's tool-call format)."""
    if message.get("tool_calls"):
        call = message["tool_calls"][0]["function"]
        text = '<tool_call>\n{"name": "' + call["name"] + '", "arguments": ' + json.dumps(call["arguments"]) + "}\n</tool_call>"
    else:
        text = message["content"]
    return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


#: ``_spec_hash(learning_spec())`` at the commit before single-mode warm-up episodes existed
#: (ce24070, computed there): the published learning experiment's cached builds stay valid.
LEARNING_SPEC_HASH = "88823b0f84ef3bf4"


def test_default_warm_up_has_single_mode_episodes_and_the_learning_one_is_unchanged() -> None:
    """The default model also sees single-mode rollouts (RFC 0006: one submit_solution call on
    the single-mode solver prompt, then the tool's "debate is over"); the learning experiment's
    warm-up is the protocol run's, spec hash included."""
    from trainer_client.rollout.tools import DEBATE_OVER
    from trainer_client.tiny_models.build import _spec_hash, _warm_up_conversations
    from trainer_client.tiny_models.recipes import TinyModelSpec, learning_spec

    spec = default_spec()
    assert spec["version"] == 8 and spec["single_episodes"] == 40
    debates, singles = _warm_up_conversations(spec)
    assert len(debates) == spec["debates"] and len(singles) == 40
    assert debates == synthetic_debates(spec["debates"], spec["seed"])  # the debates are version 7's
    for single in singles:
        assert [m["role"] for m in single] == ["system", "user", "assistant", "tool", "assistant"]
        assert single[2]["tool_calls"][0]["function"]["name"] == "submit_solution"
        assert single[3] == {"role": "tool", "name": "submit_solution", "content": DEBATE_OVER}
        assert "Solve the math problem step by step" in single[1]["content"]  # the single-mode solver prompt
    debate_problems = {d[1]["content"].split("\n\n")[1] for d in debates}
    assert not debate_problems & {s[1]["content"].split("\n\n")[1] for s in singles}  # other problems

    learning = learning_spec()
    assert learning.get("single_episodes", 0) == 0 and learning["version"] == 7
    assert _spec_hash(learning) == LEARNING_SPEC_HASH
    assert _warm_up_conversations(learning)[1] == []
    assert _spec_hash(default_spec()) != _spec_hash(TinyModelSpec(default_spec(), single_episodes=0))


def test_single_mode_warm_up_is_a_real_single_mode_rollout(server_url) -> None:
    """What the warm-up shows the model for a single-mode episode is what the adapter returns on
    a real server for the same problem: the reset text, then submit_solution's result."""
    from env_server.debate.problems import ProblemGenerator
    from trainer_client.rollout.environment import environment_factory

    (single,) = synthetic_debates(1, seed=7, mode="single")
    problem = ProblemGenerator().by_seed(10_000 + 7 * 100_000)  # synthetic_debates' first problem for seed 7
    assert problem.problem in single[1]["content"]
    env = environment_factory(server_url, mode="single")()
    assert env.reset(problem_id=problem.problem_id) == single[1]["content"]
    assert env.submit_solution(single[2]["tool_calls"][0]["function"]["arguments"]["solution"]) == single[3]["content"]
    record = env.trace.wait_record()
    assert [turn.role.value for turn in record.turns] == ["solver"] and record.facts.rounds == 0


def test_it_calls_submit_solution_on_a_single_mode_prompt(tiny_model_dir) -> None:
    """The default model's warm-up has single-mode episodes: on the single-mode solver prompt it
    calls the solver's tool most of the time."""
    tokenizer = add_response_schema(AutoTokenizer.from_pretrained(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tools = tool_callables()
    torch.manual_seed(0)
    hits = 0
    for single in synthetic_debates(12, seed=default_spec()["seed"] + 99, mode="single"):  # unseen problems
        prompt = list(tokenizer.apply_chat_template(single[:2], tools=tools, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False))
        out = model.generate(torch.tensor([prompt]), do_sample=True, temperature=1.0, max_new_tokens=60,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        parsed = parse_response(tokenizer, out[0, len(prompt):].tolist(), prefix=prompt, tools=tools)
        calls = parsed.get("tool_calls") or []
        hits += bool(calls) and calls[0]["function"]["name"] == "submit_solution"
    assert hits >= 6, hits  # most of 12


def test_the_carry_recipe_slips_only_where_a_column_carries_and_the_debate_concludes_from_the_check() -> None:
    """``sums_spec``'s warm-up debates, read back and recomputed here: a wrong solution is the
    working with the tens column's carry forgotten (10 less, on carry problems only), a hinted
    solver turn is the server's localised hint for that slip and then the right working, the
    verifier works the sum itself and says CORRECT exactly when its sum is the solution's answer,
    and the judge answers the solution on CORRECT and the verifier's sum on INCORRECT."""
    import re

    from env_server.debate.error_sites import localised_hint
    from env_server.debate.problems import ProblemGenerator

    generator = ProblemGenerator(families=["two_digit_sum"])
    kinds = {"slip": 0, "carry kept": 0, "no carry": 0, "hinted": 0, "rejected": 0}
    debates = synthetic_debates(300, 0, family="two_digit_sum", answer_accuracy=0.4, wrong_answers="carry",
                                seed_base=10**8, hint_fraction=0.3, hint_roles=["solver"], hint_style="localised",
                                restate_hints=True, verifier="worked", judge="verdict", verifier_accuracy=0.7)
    for i, debate in enumerate(debates):
        a, b = map(int, re.findall(r"\d+", generator.by_seed(10**8 + i).problem))
        carries = a % 10 + b % 10 >= 10
        calls = [m["tool_calls"][0]["function"]["arguments"] for m in debate if m.get("tool_calls")]
        hints = [m for m in debate if m.get("hint")]
        solution, review, final = calls
        answer = int(re.search(r"\\boxed\{(\d+)\}", solution["solution"]).group(1))
        assert answer in (a + b, a + b - 10) and (answer == a + b or carries)
        kinds["no carry" if not carries else "carry kept" if answer == a + b else "slip"] += 1
        if hints:
            kinds["hinted"] += 1
            problem = generator.by_seed(10**8 + i)
            assert carries and answer == a + b
            assert hints[0]["content"].startswith(localised_hint(problem, "solver", "wrong_answer", str(a + b - 10)))
        checked = int(re.search(r"The sum is \$(\d+)\$", review["critique"]).group(1))
        assert checked in (a + b, a + b - 10) and (checked == a + b or carries)
        assert review["critique"].endswith(f"The solution's answer is {answer}.")
        assert list(review) == ["critique", "verdict"]  # the check is written before the verdict
        assert review["verdict"] == ("CORRECT" if checked == answer else "INCORRECT")
        kinds["rejected"] += review["verdict"] == "INCORRECT"
        assert final["answer"] == str(answer if review["verdict"] == "CORRECT" else checked)
    assert all(kinds.values()), kinds  # every case occurs
    # 40% of the carry problems keep the carry (or were hinted back to it)
    assert 0.3 < (kinds["carry kept"] - kinds["hinted"]) / (kinds["carry kept"] + kinds["slip"] - kinds["hinted"]) < 0.5


def test_a_build_says_what_it_builds_and_why_and_a_second_run_reuses_it(tmp_path, monkeypatch, capfd) -> None:
    """tiny_model_path of a recipe with no committed build prints one line (what, why, how many
    warm-up steps, where it is kept), builds into the shared cache, and another run (another
    output folder) gets that build back without building."""
    from trainer_client.tiny_models import build
    from trainer_client.tiny_models.recipes import TinyModelSpec, default_spec

    small = TinyModelSpec(default_spec(seed=11), debates=12, single_episodes=0, sft_steps=3)
    monkeypatch.setattr(build, "tiny_model_spec", lambda name: small)
    monkeypatch.setenv("MATHDEBATE_CACHE_DIR", str(tmp_path / "cache"))
    first = build.tiny_model_path("tiny@11", tmp_path / "run-a", why="tiny@11: a default teacher of trace replay")
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("mathdebate: building")]
    assert lines == [f"mathdebate: building a tiny model (tiny@11: a default teacher of trace replay): 3 warm-up steps "
                     f"on 12 scripted episodes, kept in {first} for later runs"]
    assert first.parent == tmp_path / "cache" / "tiny-models" and (first / "model.safetensors").is_file()
    assert not list(first.parent.glob("*.building-*"))
    again = build.tiny_model_path("tiny@11", tmp_path / "run-b")
    assert again == first
    assert "mathdebate: building" not in capfd.readouterr().err
