"""π(accept | τ) of the verifier's first verdict (trainer_client.model.verdict_probs).

A bigram "language model" (the next-token distribution depends only on the last token, set by
hand) and a greedy longest-match toy tokenizer give exact expected values; the offline tiny
model checks the batched computation against plain per-rollout model calls.
"""

from __future__ import annotations

import json
import math
import string
from types import SimpleNamespace

import pytest
import torch

from env_server.protocol.markers import Role
from trainer_client.model.verdict_probs import locate_verdict, verdict_accept_probs
from trainer_client.rollout.segments import Segment, SegmentOwner, completion_segments
from trainer_client.rollout.trace import TurnLog

SOLVER = SegmentOwner(0, Role.SOLVER, True)
VERIFIER = SegmentOwner(1, Role.VERIFIER, True)


class ToyTokenizer:
    """Greedy longest match over ``words`` plus every printable character."""

    def __init__(self, words: list[str]) -> None:
        self.vocab = ["<pad>", *dict.fromkeys([*words, *string.printable])]
        self.ids = {tok: i for i, tok in enumerate(self.vocab)}
        self.pad_token_id = 0
        self.longest = max(len(tok) for tok in self.vocab)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            size = next(n for n in range(min(self.longest, len(text) - i), 0, -1) if text[i:i + n] in self.ids)
            ids.append(self.ids[text[i:i + size]])
            i += size
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(self.vocab[i] for i in ids)


class BigramLM(torch.nn.Module):
    """Logits = a row of a table picked by the last token (an embedding used as the LM head),
    with the forward signature ``forward.response_logits`` calls."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(vocab_size, vocab_size)
        torch.nn.init.zeros_(self.table.weight)
        self.dropout = torch.nn.Dropout(0.5)
        self.calls: list[dict] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, use_cache=False):
        self.calls.append({"rows": input_ids.shape[0], "training": self.training,
                           "grad": torch.is_grad_enabled(), "use_cache": use_cache})
        logits = self.dropout(self.table(input_ids))
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)

    def set_next(self, tokenizer: ToyTokenizer, after: str, probs: dict[str, float]) -> None:
        """Make the distribution after token ``after`` exactly ``probs`` (the rest shared evenly)."""
        rest = [tok for tok in tokenizer.vocab if tok not in probs]
        row = torch.full((len(tokenizer.vocab),), math.log((1.0 - sum(probs.values())) / len(rest)))
        for tok, p in probs.items():
            row[tokenizer.ids[tok]] = math.log(p)
        with torch.no_grad():
            self.table.weight[tokenizer.ids[after]] = row


def tool_call(verdict: str, critique: str = "ok", verdict_first: bool = True) -> str:
    arguments = {"verdict": verdict, "critique": critique} if verdict_first else {"critique": critique, "verdict": verdict}
    return '<tool_call>\n{"name": "submit_verdict", "arguments": ' + json.dumps(arguments) + "}\n</tool_call><eos>"


SOLVER_TEXT = '<tool_call>\n{"name": "submit_solution", "arguments": {"solution": "\\\\boxed{4}"}}\n</tool_call><eos>'
TOOL_RESULT = "<tool>[VERIFIER] Check it.</tool><assistant>"


def rollout(tokenizer: ToyTokenizer, verifier_text: str | None, owner: SegmentOwner = VERIFIER):
    """(prompt ids, completion ids, segments): a solver call, its tool result, the verifier segment."""
    prompt = tokenizer.encode("<user>What is 2+2?</user><assistant>")
    solver = tokenizer.encode(SOLVER_TEXT)
    segments = [Segment(0, len(solver), SOLVER)]
    completion = list(solver)
    if verifier_text is not None:
        completion += tokenizer.encode(TOOL_RESULT)
        verifier = tokenizer.encode(verifier_text)
        segments.append(Segment(len(completion), len(completion) + len(verifier), owner))
        completion += verifier
    return prompt, completion, segments


WORDS = ["<tool_call>", "</tool_call>", "<eos>", "<tool>", "</tool>", "<assistant>", "<user>", "</user>",
         "submit_verdict", "submit_solution", "VERDICT", "CORRECT", "INCORRECT", "correct", "incorrect"]


def run(tokenizer, model, rollouts, **kwargs):
    prompts, completions, segments = zip(*rollouts, strict=True)
    return verdict_accept_probs(model, tokenizer, list(prompts), list(completions), list(segments), **kwargs)


def test_tool_call_and_fallback_verdicts_exact_in_one_forward() -> None:
    tok = ToyTokenizer(WORDS)
    model = BigramLM(len(tok.vocab))
    model.set_next(tok, '"', {"CORRECT": 0.4, "INCORRECT": 0.1})  # before the tool call's verdict word
    model.set_next(tok, " ", {"CORRECT": 0.3, "INCORRECT": 0.45})  # after "VERDICT:" in plain text
    rollouts = [rollout(tok, tool_call("CORRECT")),
                rollout(tok, "Step 2 is wrong.\n\nVERDICT: INCORRECT<eos>"),
                rollout(tok, tool_call("INCORRECT", verdict_first=False))]
    probs = run(tok, model, rollouts)
    assert probs == [pytest.approx(0.8, abs=1e-6), pytest.approx(0.4, abs=1e-6), pytest.approx(0.8, abs=1e-6)]
    assert len(model.calls) == 1 and model.calls[0]["rows"] == 6  # one forward, two rows per rollout
    assert not model.calls[0]["grad"] and not model.calls[0]["use_cache"]


def test_boundary_token_glued_to_the_word() -> None:
    """The token holding the word's first character starts at the quote before it ("CORRECT is
    one token, "INCORRECT is two): both alternatives are scored from the quote."""
    tok = ToyTokenizer([*WORDS, '"CORRECT'])
    model = BigramLM(len(tok.vocab))
    assert tok.decode(tok.encode(' "CORRECT"')[1:2]) == '"CORRECT'
    model.set_next(tok, " ", {'"CORRECT': 0.3, '"': 0.4})
    model.set_next(tok, '"', {"INCORRECT": 0.5})
    # p('"CORRECT') = 0.3, p('"INCORRECT') = 0.4 * 0.5 = 0.2
    assert run(tok, model, [rollout(tok, tool_call("CORRECT"))]) == [pytest.approx(0.6, abs=1e-6)]


def test_multi_token_verdict_word() -> None:
    tok = ToyTokenizer([w for w in WORDS if w != "INCORRECT"] + ["IN"])
    model = BigramLM(len(tok.vocab))
    assert [tok.vocab[i] for i in tok.encode("INCORRECT")] == ["IN", "CORRECT"]
    model.set_next(tok, '"', {"CORRECT": 0.4, "IN": 0.5})
    model.set_next(tok, "IN", {"CORRECT": 0.2})
    # the model wrote INCORRECT: p(CORRECT) = 0.4, p(INCORRECT) = 0.5 * 0.2 = 0.1
    assert run(tok, model, [rollout(tok, tool_call("INCORRECT"))]) == [pytest.approx(0.8, abs=1e-6)]


def test_alternatives_in_the_case_the_model_wrote() -> None:
    tok = ToyTokenizer(WORDS)
    model = BigramLM(len(tok.vocab))
    model.set_next(tok, " ", {"correct": 0.6, "incorrect": 0.2, "CORRECT": 0.01, "INCORRECT": 0.1})
    # " correct." is read as VERDICT: CORRECT. by the server; scored as correct / incorrect
    assert run(tok, model, [rollout(tok, tool_call(" correct."))]) == [pytest.approx(0.75, abs=1e-6)]


def test_verdict_read_from_the_critique_when_the_argument_has_none() -> None:
    """verdict="MAYBE": the server reads the critique's last marker (here after a JSON-escaped
    newline, so decoded and generated offsets differ)."""
    tok = ToyTokenizer(WORDS)
    model = BigramLM(len(tok.vocab))
    model.set_next(tok, " ", {"CORRECT": 0.1, "INCORRECT": 0.3})
    text = tool_call("MAYBE", critique="Checked\u00e9.\nVERDICT: INCORRECT", verdict_first=False)
    assert "\\n" in text and "\\u00e9" in text
    assert run(tok, model, [rollout(tok, text)]) == [pytest.approx(0.25, abs=1e-6)]


def test_none_without_a_readable_first_verdict() -> None:
    tok = ToyTokenizer(WORDS)
    model = BigramLM(len(tok.vocab))
    prompt, completion, _ = rollout(tok, tool_call("CORRECT"))
    rollouts = [
        (prompt, completion, None),                                         # unaligned rollout
        rollout(tok, None),                                                 # verifier forfeited: no segment
        rollout(tok, tool_call("CORRECT"), SegmentOwner(1, Role.VERIFIER, False)),  # a rejected attempt only
        rollout(tok, "Looks fine to me.<eos>"),                             # fallback without a verdict
        rollout(tok, tool_call("MAYBE")),                                   # the server reads no verdict
        rollout(tok, tool_call("The answer is CORRECT")),                   # VERDICT: THE ANSWER IS ... unread
        rollout(tok, "<think>VERDICT: CORRECT</think>Not sure.<eos>"),     # only in the reasoning block
    ]
    assert run(tok, model, rollouts) == [None] * len(rollouts)
    assert model.calls == []  # nothing to score: no forward


def test_first_verifier_turn_wins_and_padding_is_dropped() -> None:
    """With two verifier turns the smallest t is scored; a left-padded prompt tensor with its
    mask gives the same value as the unpadded lists; chunked forwards agree."""
    tok = ToyTokenizer(WORDS)
    model = BigramLM(len(tok.vocab))
    model.set_next(tok, '"', {"CORRECT": 0.4, "INCORRECT": 0.1})
    model.set_next(tok, " ", {"CORRECT": 0.1, "INCORRECT": 0.1})
    prompt, completion, segments = rollout(tok, tool_call("CORRECT"))
    later = tok.encode("VERDICT: INCORRECT<eos>")
    two_turns = [Segment(s.start, s.end, s.owner) for s in segments]
    two_turns.append(Segment(len(completion), len(completion) + len(later), SegmentOwner(3, Role.VERIFIER, True)))
    rows = [(prompt, completion + later, list(reversed(two_turns))), rollout(tok, "VERDICT: INCORRECT<eos>")]
    assert run(tok, model, rows) == [pytest.approx(0.8, abs=1e-6), pytest.approx(0.5, abs=1e-6)]
    width = len(prompt) + 3
    padded = torch.tensor([[0] * (width - len(prompt)) + prompt, [0] * (width - len(rows[1][0])) + rows[1][0]])
    mask = (torch.arange(width) >= torch.tensor([[width - len(prompt)], [width - len(rows[1][0])]])).long()
    c_width = max(len(r[1]) for r in rows)
    completions = torch.tensor([r[1] + [0] * (c_width - len(r[1])) for r in rows])
    probs = verdict_accept_probs(model, tok, padded, completions, [r[2] for r in rows], prompt_mask=mask,
                                 max_rows_per_forward=2)
    assert probs == [pytest.approx(0.8, abs=1e-6), pytest.approx(0.5, abs=1e-6)]
    assert [c["rows"] for c in model.calls[-2:]] == [2, 2]


def test_model_modes_restored() -> None:
    tok = ToyTokenizer(WORDS)
    model = BigramLM(len(tok.vocab))
    model.train()
    model.dropout.train(False)  # a submodule in its own mode stays so
    run(tok, model, [rollout(tok, tool_call("CORRECT"))])
    assert model.calls[0]["training"] is False  # dropout off during the forward
    assert model.training and not model.dropout.training and model.table.training
    assert model.table.weight.grad is None


def test_locate_verdict_positions() -> None:
    text = tool_call("INCORRECT", critique="VERDICT: CORRECT (kidding)")
    location = locate_verdict(text)
    assert location is not None and location.verdict == "INCORRECT" and location.source == "tool"
    assert location.start == text.index('INCORRECT"')  # the argument, not the critique's marker
    plain = "Fine.\n\nVERDICT: **Correct**\nverdict: incorrect!"
    location = locate_verdict(plain)
    assert location is not None and (location.verdict, location.generated) == ("INCORRECT", "incorrect")
    assert location.start == plain.index("incorrect")
    assert locate_verdict('<tool_call>{"name": "submit_verdict", "arguments": {"verdict": "\\u0043ORRECT", '
                          '"critique": "x"}}</tool_call>') is None  # an escaped letter: no token boundary
    assert locate_verdict('<tool_call>{"name": "submit_verdict", "arguments": {"verdict": "CORRECT"}}</tool_call>'
                          ) is None  # no critique: the tool raised, this call was not the turn


# ---------------------------------------------------------------------- the offline tiny model


def _by_hand(model, tokenizer, prompt: list[int], completion: list[int], segment: Segment, word_start: int) -> float:
    """exp(lp C) / (exp(lp C) + exp(lp I)) with plain, unbatched model calls; the boundary token
    found by decoding every prefix."""
    tokens = completion[segment.start:segment.end]
    text = tokenizer.decode(tokens)
    k = next(j for j in range(len(tokens)) if len(tokenizer.decode(tokens[:j + 1])) > word_start)
    c_k = len(tokenizer.decode(tokens[:k]))
    context = prompt + completion[:segment.start + k]
    logps = []
    for word in ("CORRECT", "INCORRECT"):
        continuation = tokenizer.encode(text[c_k:word_start] + word, add_special_tokens=False)
        ids = context + continuation
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
        logps.append(sum(logits[p - 1, ids[p]].item() for p in range(len(context), len(ids))))
    return math.exp(logps[0]) / (math.exp(logps[0]) + math.exp(logps[1]))


def test_tiny_model_matches_direct_computation(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.rollout.tool_calls import tool_callables
    from trainer_client.tiny_models.build import rollout_tokens
    from trainer_client.tiny_models.warmup_debates import synthetic_debates

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tools = tool_callables()
    messages = synthetic_debates(1, seed=7)[0]  # system, user, solver/verifier/judge calls with tool results, "Done."
    ids, mask = rollout_tokens(tokenizer, messages, tools)  # laid out as TRL's tool loop lays it out
    prompt = list(tokenizer.apply_chat_template(messages[:2], tools=tools, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    completion, model_tokens = ids[len(prompt):], mask[len(prompt):]
    roles = {"submit_solution": Role.SOLVER, "submit_verdict": Role.VERIFIER, "submit_final_answer": Role.JUDGE}
    turns = [TurnLog(t, roles[m["name"]], "tool", returned=m["content"])
             for t, m in enumerate(m for m in messages if m["role"] == "tool")]
    segments = completion_segments(messages[2:], turns, model_tokens)
    assert segments is not None and segments[1].owner == VERIFIER
    tool_segment = segments[1]

    # A second rollout whose verifier stopped calling tools: its plain message is the fallback turn
    # (the tiny tokenizer glues the space to the word: " CORRECT" is one token).
    fallback_text = "Checked the sum.\n\nVERDICT: CORRECT"
    end_solver = segments[0].end
    suffix_end = next(i for i in range(end_solver, len(model_tokens)) if model_tokens[i])
    own = [*tokenizer.encode(fallback_text, add_special_tokens=False), tokenizer.eos_token_id]
    fallback_completion = completion[:suffix_end] + own
    fallback_segment = Segment(suffix_end, suffix_end + len(own), VERIFIER)
    fallback_segments = [segments[0], fallback_segment]

    model.train()
    probs = verdict_accept_probs(model, tokenizer, [prompt, prompt], [completion, fallback_completion],
                                 [segments, fallback_segments])
    assert model.training
    model.train(False)

    tool_text = tokenizer.decode(completion[tool_segment.start:tool_segment.end])
    tool_word = tool_text.index('"verdict": "') + len('"verdict": "')
    verdict = messages[4]["tool_calls"][0]["function"]["arguments"]["verdict"]
    assert tool_text[tool_word:].startswith(verdict)
    fallback_word = fallback_text.index("VERDICT: ") + len("VERDICT: ")
    expected = [_by_hand(model, tokenizer, prompt, completion, tool_segment, tool_word),
                _by_hand(model, tokenizer, prompt, fallback_completion, fallback_segment, fallback_word)]
    assert all(p is not None and 0.0 < p < 1.0 for p in probs)
    assert probs == [pytest.approx(expected[0], abs=1e-4), pytest.approx(expected[1], abs=1e-4)]
