"""The offline tiny model: loads without a hub, uses TRL's template, emits tool calls."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.chat_template_utils import add_response_schema, parse_response

from trainer_client.tiny_model import _rollout_tokens, build_tiny_model, default_spec, synthetic_debates, tool_callables


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
        verifier_context, _ = _rollout_tokens(tokenizer, debate[:4], tools)
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

    from trainer_client.tiny_model import SPECIAL_TOKENS, _train_tokenizer

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
    ids, mask = _rollout_tokens(tokenizer, debate, tools)
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
