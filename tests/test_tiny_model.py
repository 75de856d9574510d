"""The offline tiny model: loads without a hub, uses TRL's template, emits tool calls."""

from __future__ import annotations

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
