"""π(accept | τ): the policy's probability of accepting the solver's first answer.

``coma_advantage`` (:mod:`trainer_client.credit.shaping.coma`) needs, per rollout, the acting agent's
policy over its own action, ``π^a(u'^a | τ^a)`` in COMA's baseline (J. Foerster et al.,
"Counterfactual Multi-Agent Policy Gradients", AAAI 2018, Eq. 4). The verifier's action is its
first verdict (turn ``t = 1`` of the debate, the review of the solver's first answer), with two
values: *accept* (``CORRECT``) and *reject* (``INCORRECT``). This module reads that probability
off the policy's own next-token distribution at the place where the verdict word was generated,
and feeds :data:`trainer_client.credit.shaping.base.VERIFIER_ACCEPT_PROB`.

**Where the verdict is.** In rollout ``i``, the segment (:class:`~trainer_client.rollout.segments.Segment`)
whose owner is the verifier's first produced turn (``role`` VERIFIER, ``produced`` True, the
smallest ``t``) is decoded to text, and the verdict word is located as the server reads it
(:func:`locate_verdict`):

- a tool call (a ``<tool_call>{"name": "submit_verdict", "arguments": {...}}</tool_call>`` block,
  the JSON tool-call format of Qwen2.5/Qwen3 templates and of the offline tiny model; the first
  such call with a string ``verdict`` and a ``critique``): the environment submits
  ``f"{critique}\\n\\nVERDICT: {verdict.strip().upper()}"`` and the server reads the last
  ``VERDICT: CORRECT|INCORRECT`` of that text (:func:`env_server.debate.answers.parse_verdict`). The
  word it reads is normally in the ``verdict`` argument's value (``"CORRECT"``,
  ``" correct."``, ``"**INCORRECT**"``), and then the word's first character is located in the
  generated JSON text (escape sequences accounted for); when the argument holds no verdict
  (``"MAYBE"``) but the critique does, the server reads the critique's last marker and that
  word is used instead;
- otherwise a fallback message (a final assistant message without a tool call, submitted as
  the turn): the last ``VERDICT:`` marker followed by CORRECT/INCORRECT, with the server's own
  regular expression, in the text after the last ``</think>`` (TRL submits the message's
  content, without its reasoning block).

**Which token.** The segment's tokens are decoded incrementally (the prefix/read-offset scheme
of streaming detokenisers, so a token that ends inside a multi-byte character is grouped with
the token that completes it), giving the character at which each token starts; ``k`` is the
token that contains the verdict word's first character and ``c_k`` the character where that
token starts. ``k`` may start before the word: Qwen's pre-tokeniser glues a quote to the letters
after it (``"CORRECT`` is one pre-token), the tiny model's glues a space (`` CORRECT``).

**Tokenisation choice: re-tokenise from the start of token k.** The context is exactly what the
model had: the prompt and the completion's tokens before ``k`` (``completion[: segment.start +
k]``), the model's own tokens, never re-tokenised. Each alternative is the *string*
``text[c_k : word] + W`` (``W`` = ``CORRECT`` or ``INCORRECT``), tokenised on its own
(``tokenizer.encode(..., add_special_tokens=False)``), and its summed log-probability given the
context is the log-probability of that string's canonical tokenisation. Both alternatives share
the characters before the word, so the ratio of their probabilities is the ratio
``p(W_accept | context + text[c_k:word]) / p(W_reject | ...)`` whatever merges the boundary
makes (``"CORRECT`` may be one token where ``"INCORRECT`` is two). Appending alternative tokens
to the model's tokens up to and including the boundary token instead would score a token
sequence the tokeniser never produces (``"`` then ``CORRECT`` where the model would write
``"CORRECT``). Guards: ``decode(tokens[:k]) == text[:c_k]`` and ``decode(tokens[:k] +
encode(alternative)) == text[:c_k] + alternative`` (a tokeniser that adds a prefix space, as
SentencePiece does, fails the second and the rollout gets ``None``).

The alternatives are written in the case the model used (``correct``/``incorrect`` after a
lower-case verdict, ``Correct``/``Incorrect`` after a capitalised one, upper case otherwise):
the server reads any case. Only the word is scored, not what follows it, so ``p(CORRECT)``
includes continuations such as ``CORRECTLY`` (neither word is a prefix of the other).

**Output.** ``π(accept) = p(CORRECT) / (p(CORRECT) + p(INCORRECT))``: a renormalisation over the
two verdicts (the policy's mass on other continuations, such as a malformed verdict, is left
out), computed as ``sigmoid(log p(CORRECT) − log p(INCORRECT))``; ``π(reject) = 1 − π(accept)``.

**Cost.** One forward under ``torch.no_grad()`` over two rows per rollout with a located verdict
(context plus a continuation of a few tokens; only the continuation's logits are kept), in one
batch (or in chunks of ``max_rows_per_forward`` rows), plus ``O(segment length)`` short decodes
on the CPU.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from env_server.debate.answers import VERDICT_PATTERN  # the server's own verdict pattern (parse_verdict)
from env_server.protocol.markers import Role
from trainer_client.model.forward import pack_responses, response_logits
from trainer_client.rollout.segments import Segment

__all__ = ["VerdictLocation", "VerdictSite", "find_verdict_site", "first_verifier_segment", "locate_verdict",
           "verdict_accept_probs"]

_TOOL_CALL_OPEN = re.compile(r"<tool_call>\s*")
_JSON_WS = re.compile(r"[ \t\n\r]*")
_THINK_CLOSE = "</think>"
_DECODER = json.JSONDecoder()
#: the text the environment puts between the critique and the verdict (``DebateEnvironment.submit_verdict``)
_VERDICT_JOIN = "\n\nVERDICT: "
ACCEPT, REJECT = "CORRECT", "INCORRECT"


@dataclass(frozen=True)
class VerdictLocation:
    """The verdict word the server reads, in a segment's text.

    Attributes:
        start: character offset of the word's first character in the text.
        verdict: ``"CORRECT"`` or ``"INCORRECT"``, as the server reads it.
        generated: the word as the model wrote it (its case may differ).
        source: ``"tool"`` (a ``submit_verdict`` call) or ``"fallback"`` (plain message text).
    """

    start: int
    verdict: str
    generated: str
    source: str


@dataclass(frozen=True)
class VerdictSite:
    """Where to score the two verdicts in one rollout.

    Attributes:
        position: index ``k`` in the completion (``segment.start +`` the segment-relative
            index) of the token containing the verdict word's first character; the context is
            ``prompt + completion[:position]``.
        continuations: token ids of ``(accept, reject)``: each is ``text[c_k : word]`` followed by
            the word, tokenised on its own.
        location: the verdict as located in the segment's text.
    """

    position: int
    continuations: tuple[list[int], list[int]]
    location: VerdictLocation


# ---------------------------------------------------------------------- segments and text


def first_verifier_segment(segments: Sequence[Segment] | None) -> Segment | None:
    """The segment that produced the verifier's first turn (smallest ``t``), or ``None``."""
    produced = [s for s in segments or () if s.owner is not None and s.owner.produced
                and s.owner.role is Role.VERIFIER]
    return min(produced, key=lambda s: s.owner.t if s.owner is not None else 0, default=None)


def _skip_ws(text: str, i: int) -> int:
    match = _JSON_WS.match(text, i)
    return match.end() if match is not None else i


def _json_members(text: str, pos: int) -> list[tuple[str, int, Any]] | None:
    """The members ``(key, value_start, value)`` of the JSON object opening at ``text[pos]``, in
    order (duplicates kept), or ``None`` when it is not a well-formed object."""
    if not text.startswith("{", pos):
        return None
    members: list[tuple[str, int, Any]] = []
    i = _skip_ws(text, pos + 1)
    if text.startswith("}", i):
        return members
    try:
        while True:
            if not text.startswith('"', i):
                return None
            key, i = _DECODER.raw_decode(text, i)
            i = _skip_ws(text, i)
            if not text.startswith(":", i):
                return None
            start = _skip_ws(text, i + 1)
            value, i = _DECODER.raw_decode(text, start)
            members.append((key, start, value))
            i = _skip_ws(text, i)
            if text.startswith(",", i):
                i = _skip_ws(text, i + 1)
            elif text.startswith("}", i):
                return members
            else:
                return None
    except ValueError:  # json.JSONDecodeError
        return None


def _string_char_positions(text: str, quote: int, value: str) -> list[int] | None:
    """For the JSON string literal opening at ``text[quote]`` that decodes to ``value``: the
    index in ``text`` at which each decoded character's source starts (an escape sequence is
    one character; a ``\\uD8xx\\uDCxx`` surrogate pair too, as :mod:`json` decodes it)."""
    positions, i = [], quote + 1
    try:
        while text[i] != '"':
            positions.append(i)
            if text[i] != "\\":
                i += 1
            elif text[i + 1] != "u":
                i += 2
            else:
                code = int(text[i + 2:i + 6], 16)
                pair = (0xD800 <= code < 0xDC00 and text.startswith("\\u", i + 6)
                        and 0xDC00 <= int(text[i + 8:i + 12], 16) < 0xE000)
                i += 12 if pair else 6
    except (IndexError, ValueError):
        return None
    return positions if len(positions) == len(value) else None


def _verdict_call(text: str) -> dict[str, tuple[int, Any]] | None:
    """The arguments ``{name: (value_start, value)}`` of the first well-formed ``submit_verdict``
    tool call in ``text`` with a string ``verdict`` and a ``critique`` (a call without them
    raises in the tool, so it is not the produced turn), or ``None`` when there is none."""
    for opening in _TOOL_CALL_OPEN.finditer(text):
        call = _json_members(text, opening.end())
        if call is None:
            continue
        fields = {key: (start, value) for key, start, value in call}  # the last duplicate wins, as in json
        if fields.get("name", (0, None))[1] != "submit_verdict" or "arguments" not in fields:
            continue
        arguments = _json_members(text, fields["arguments"][0])
        if arguments is None:
            continue
        args = {key: (start, value) for key, start, value in arguments}
        if "critique" in args and isinstance(args.get("verdict", (0, None))[1], str):
            return args
    return None


def _read_tool_verdict(text: str, verdict: tuple[int, str], critique: tuple[int, Any]) -> VerdictLocation | None:
    (verdict_quote, value), (critique_start, critique_value) = verdict, critique
    stripped = value.strip()
    critique_text = f"{critique_value}"
    submitted = f"{critique_text}{_VERDICT_JOIN}{stripped.upper()}"  # what submit_verdict sends
    matches = list(VERDICT_PATTERN.finditer(submitted))
    if not matches:
        return None
    word_start, word = matches[-1].start(1), matches[-1].group(1).upper()
    appended = len(critique_text) + len(_VERDICT_JOIN)
    if word_start >= appended:  # in the verdict argument
        if len(stripped.upper()) != len(stripped):
            return None  # upper() changed the length: offsets no longer map back
        offset = len(value) - len(value.lstrip()) + word_start - appended
        positions = _string_char_positions(text, verdict_quote, value)
    elif isinstance(critique_value, str) and word_start + len(word) <= len(critique_text):
        offset = word_start
        positions = _string_char_positions(text, critique_start, critique_value)
    else:
        return None
    if positions is None:
        return None
    spans = positions[offset:offset + len(word)]
    start = spans[0]
    generated = text[start:start + len(word)]
    if spans != list(range(start, start + len(word))) or generated.upper() != word:
        return None  # an escaped letter in the word: no token boundary to score at
    return VerdictLocation(start, word, generated, "tool")


def locate_verdict(text: str) -> VerdictLocation | None:
    """The verdict word the server would read from a verifier segment's decoded text.

    Args:
        text: the segment's tokens decoded (special tokens kept).

    Returns:
        Its location (see the module docstring), or ``None``: no verdict the server reads, or a
        verdict word whose letters are escaped in the tool-call JSON.
    """
    call = _verdict_call(text)
    if call is not None:
        return _read_tool_verdict(text, call["verdict"], call["critique"])
    think = text.rfind(_THINK_CLOSE)
    matches = list(VERDICT_PATTERN.finditer(text, think + len(_THINK_CLOSE) if think >= 0 else 0))
    if not matches:
        return None
    match = matches[-1]
    return VerdictLocation(match.start(1), match.group(1).upper(), match.group(1), "fallback")


# ---------------------------------------------------------------------- tokens


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _token_start(tokenizer: Any, ids: Sequence[int], char: int, text: str) -> tuple[int, int] | None:
    """``(k, c_k)``: the token containing character ``char`` of ``text`` (= ``decode(ids)``) and
    the character where it starts, by incremental decoding (a run of tokens that only together
    decode to whole characters counts as one, starting at its first token). ``None`` when the
    pieces do not add up to ``text``."""
    decoded, prefix_offset, read_offset = "", 0, 0
    group = (0, 0)
    for j in range(len(ids)):
        prefix_text = _decode(tokenizer, ids[prefix_offset:read_offset])
        new_text = _decode(tokenizer, ids[prefix_offset:j + 1])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd") or not new_text.startswith(prefix_text):
            continue  # an incomplete character (or nothing yet): wait for the next token
        group = (read_offset, len(decoded))
        decoded += new_text[len(prefix_text):]
        prefix_offset, read_offset = read_offset, j + 1
        if len(decoded) > char:
            return group if text.startswith(decoded) else None
    return None


def find_verdict_site(tokenizer: Any, completion: Sequence[int], segment: Segment) -> VerdictSite | None:
    """Locate the verdict of one rollout's first verifier segment and build the two
    continuations to score (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer (``decode``, ``encode``).
        completion: the rollout's completion token ids (right padding, if any, is ignored).
        segment: the verifier's first produced segment (:func:`first_verifier_segment`).

    Returns:
        The site, or ``None`` when no verdict is located or the tokenisation checks fail.
    """
    tokens = list(completion[segment.start:segment.end])
    text = _decode(tokenizer, tokens)
    location = locate_verdict(text)
    if location is None:
        return None
    found = _token_start(tokenizer, tokens, location.start, text)
    if found is None:
        return None
    k, c_k = found
    if _decode(tokenizer, tokens[:k]) != text[:c_k]:
        return None
    style = (str.lower if location.generated.islower()
             else str.capitalize if location.generated.istitle() else str.upper)
    continuations: list[list[int]] = []
    for word in (ACCEPT, REJECT):
        continuation = text[c_k:location.start] + style(word)
        ids = list(tokenizer.encode(continuation, add_special_tokens=False))
        if not ids or _decode(tokenizer, tokens[:k] + ids) != text[:c_k] + continuation:
            return None
        continuations.append(ids)
    return VerdictSite(segment.start + k, (continuations[0], continuations[1]), location)


# ---------------------------------------------------------------------- the forward


def _rows(ids: Sequence[Sequence[int]] | torch.Tensor, mask: Sequence[Sequence[int]] | torch.Tensor | None
          ) -> list[list[int]]:
    rows = ids.tolist() if isinstance(ids, torch.Tensor) else [list(r) for r in ids]
    if mask is None:
        return rows
    keep = mask.tolist() if isinstance(mask, torch.Tensor) else [list(m) for m in mask]
    return [[tok for tok, m in zip(row, row_mask, strict=True) if m] for row, row_mask in zip(rows, keep, strict=True)]


def _summed_logprobs(model: torch.nn.Module, contexts: list[list[int]], responses: list[list[int]], pad_id: int,
                     max_rows: int | None) -> list[float]:
    device = next(model.parameters()).device
    step = max_rows or len(contexts)
    sums: list[float] = []
    for lo in range(0, len(contexts), step):
        batch = pack_responses(contexts[lo:lo + step], responses[lo:lo + step], pad_id, device)
        logps = torch.log_softmax(response_logits(model, batch).float(), dim=-1)
        token_logps = logps.gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)
        sums.extend(torch.where(batch.mask, token_logps, 0.0).sum(-1).tolist())
    return sums


def verdict_accept_probs(model: torch.nn.Module, tokenizer: Any,
                         prompt_ids: Sequence[Sequence[int]] | torch.Tensor,
                         completion_ids: Sequence[Sequence[int]] | torch.Tensor,
                         segments: Sequence[Sequence[Segment] | None], *,
                         prompt_mask: Sequence[Sequence[int]] | torch.Tensor | None = None,
                         max_rows_per_forward: int | None = None) -> list[float | None]:
    """π(accept | τ) of the verifier's first verdict, per rollout (see the module docstring).

    Args:
        model: the current policy, a causal LM whose forward takes ``input_ids``,
            ``attention_mask``, ``position_ids``, ``logits_to_keep`` and ``use_cache`` and
            returns ``.logits`` (``forward.response_logits``); an unwrapped module. Run under
            ``torch.no_grad()``, with every submodule in inference mode for the call (dropout
            off); each submodule's ``training`` flag is restored afterwards.
        tokenizer: its tokenizer (``decode``, ``encode``, ``pad_token_id``).
        prompt_ids: ``(B, P)`` long tensor or ``B`` lists of token ids: the prompt of each
            rollout. With ``prompt_mask`` the positions where the mask is 0 (TRL's left padding)
            are dropped; without it every id is part of the prompt.
        completion_ids: ``(B, C)`` long tensor or ``B`` lists: each rollout's completion, the
            tokens the segments index (right padding is never read).
        segments: per rollout, its segments (``segments.completion_segments``), or ``None``.
        prompt_mask: ``(B, P)`` 0/1, TRL's ``prompt_mask``; optional.
        max_rows_per_forward: at most this many rows (two per rollout) per forward; ``None``
            (default) = all in one forward.

    Returns:
        ``B`` entries: a probability (Python float in ``[0, 1]``), ``p(CORRECT) / (p(CORRECT) +
        p(INCORRECT))`` at the verdict of the verifier's first turn; ``None`` when it is not
        known: no segments, no produced verifier segment (no verifier turn, or a forfeited one),
        no verdict the server reads in it (missing, ``MAYBE``), or a tokenisation the checks
        reject.

    Source: COMA (Foerster et al., AAAI 2018), ``π^a(u'^a | τ^a)`` of the acting agent.
    Cost: one batched forward over two short continuations per rollout with a verdict.
    """
    prompts = _rows(prompt_ids, prompt_mask)
    completions = _rows(completion_ids, None)
    if not len(prompts) == len(completions) == len(segments):
        raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions, {len(segments)} segment lists")
    sites: list[tuple[int, VerdictSite]] = []
    for i, (completion, segs) in enumerate(zip(completions, segments, strict=True)):
        segment = first_verifier_segment(segs)
        site = find_verdict_site(tokenizer, completion, segment) if segment is not None else None
        if site is not None:
            sites.append((i, site))
    result: list[float | None] = [None] * len(prompts)
    if not sites:
        return result
    contexts: list[list[int]] = []
    responses: list[list[int]] = []
    for i, site in sites:
        context = prompts[i] + completions[i][:site.position]
        contexts += [context, context]
        responses += list(site.continuations)
    pad_id = next((p for p in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None))
                   if p is not None), 0)
    modes = [(module, module.training) for module in model.modules()]
    try:
        model.train(False)
        with torch.no_grad():
            sums = _summed_logprobs(model, contexts, responses, pad_id, max_rows_per_forward)
    finally:
        for module, mode in modes:
            module.training = mode
    for n, (i, _) in enumerate(sites):
        result[i] = _accept_share(sums[2 * n], sums[2 * n + 1])
    return result


def _accept_share(accept: float, reject: float) -> float | None:
    """``exp(accept) / (exp(accept) + exp(reject))`` for two log-probabilities, without
    overflow; ``None`` when undefined (both ``-inf``, or a NaN)."""
    if math.isnan(accept) or math.isnan(reject) or accept == reject == -math.inf:
        return None
    diff = accept - reject
    if diff >= 0:
        return 1.0 / (1.0 + math.exp(-diff))
    odds = math.exp(diff)
    return odds / (1.0 + odds)
