"""A role played by a local transformers model (``hf:PATH``), in the tool-call format it was
trained in.

The model sees what TRL's tool loop shows it during training, built by the same functions the
held-out evaluation uses (:mod:`trainer_client.evaluation.heldout`), kept per episode by
:class:`TokenConversations`: a rollout starts with
:func:`~trainer_client.evaluation.heldout.observation_prompt_ids` (system prompt, the role's instructions,
the tools); the model answers with a tool call, read as the ``openai-tools:`` policy reads a
served model's reply (:func:`~trainer_client.evaluation.openai_tools.read_tool_reply` of
:func:`~trainer_client.evaluation.openai_tools.hermes_reply` of the turn's text), so that both play
the same debates: a valid call of the acting role's tool is the action; a call the role's tool
does not take submits the text outside the call, or the forfeit placeholder
(``invalid_tool_call``); a turn without a parsable call submits its text, or the placeholder when
it is blank. After a turn with a call, the next turn continues the same conversation
(:func:`~trainer_client.evaluation.heldout.extend_context`: the model's tokens, then the tool
result holding the next role's instructions); after a turn without one (in training, such a turn
ends the rollout), or when another policy played the turn in between (per-role policies), the
model's conversation restarts from the current observation: it sees the debate so far in the
instructions, as a rollout's first prompt.

Requests from concurrent episodes are gathered into batches (up to ``batch_size``, one sampling
temperature per batch) and generated in a worker thread, so the event loop keeps serving the
other episodes. Sampled batches are seeded from the run seed and a batch counter: a run is
reproducible at a fixed concurrency.

Verdict probabilities (best-of-N): ``P(CORRECT)`` of a verifier turn is read from the model's
next-token distribution at the verdict word it generated
(:func:`trainer_client.model.verdict_probs.verdict_accept_probs`, the function COMA's baseline uses).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_server.protocol.markers import Role
from trainer_client.evaluation.policies import Policy, PolicyOptions, TurnReply, TurnRequest

__all__ = ["HFPolicy", "TokenConversations", "TokenTurn", "load_hf_model"]


def load_hf_model(path: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a checkpoint directory or hub id; ``tiny`` and
    ``tiny-learning`` build (or reuse) the offline tiny models under ``outputs/``;
    ``DIR#ADAPTER`` is the role adapter ``DIR/ADAPTER`` that ``mathdebate train`` with a
    ``policies`` section wrote under ``final/``, on its base model
    (:func:`~trainer_client.policies.adapters.load_adapter_model`). The model goes to the GPU
    when one is visible, and is left in inference mode.

    Raises:
        FileNotFoundError: ``DIR#ADAPTER`` names no adapter folder.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_client.tiny_models.build import tiny_model_path
    from trainer_client.tiny_models.recipes import is_tiny_model_name

    path, _, adapter = path.partition("#")
    where: str | Path = tiny_model_path(path, Path("outputs")) if is_tiny_model_name(path) else path
    if adapter:
        from trainer_client.policies.adapters import load_adapter_model

        model, tokenizer = load_adapter_model(where, adapter)
    else:
        model = AutoModelForCausalLM.from_pretrained(where)
        tokenizer = AutoTokenizer.from_pretrained(where)
    if torch.cuda.is_available():
        model = model.to("cuda")  # type: ignore[arg-type]  # transformers' stubs type .to() as a decorated method
    model.train(False)
    return model, tokenizer


@dataclass
class _Conversation:
    context: list[int]
    next_t: int
    role: Role


@dataclass(frozen=True)
class TokenTurn:
    """A generated turn read in the token layout (:meth:`TokenConversations.record`).

    Attributes:
        action: the action to submit (the placeholder ``(no response)`` when the turn gives none).
        forfeit: ``"invalid_tool_call"`` for a call the role's tool does not take and no text, else ``None``.
        generated: the turn's own text (up to its end-of-turn token).
        after: the context after the turn: ``context``, the turn's tokens and the end-of-turn token.
    """

    action: str
    forfeit: str | None
    generated: str
    after: list[int]


class TokenConversations:
    """Per-episode token contexts of the ``hf:`` layout (see the module docstring): which token ids
    each turn is generated from, and what a generated turn submits.

    Args:
        tokenizer: the model's tokenizer (the training chat template's special tokens).
        tools: the environment's tools as TRL passes them (:func:`~trainer_client.rollout.tool_calls.tool_callables`).
        template: the training chat template (:func:`~trainer_client.tiny_models.build.training_chat_template`;
            ``None``: the tokenizer's own).
    """

    def __init__(self, tokenizer: Any, tools: list[Any], template: str | None) -> None:
        self.tokenizer, self.tools, self.template = tokenizer, tools, template
        self.conversations: dict[str, _Conversation] = {}
        self.turn_contexts: dict[tuple[str, int], list[int]] = {}  # draw 0's context per (episode, t)

    def context(self, request: TurnRequest) -> list[int]:
        """The token ids ``request``'s turn is generated from (1-D, ``int`` ids)."""
        from trainer_client.evaluation.heldout import observation_prompt_ids

        observation = request.observation
        if request.draw > 0 and (request.episode_key, observation.t) in self.turn_contexts:
            return self.turn_contexts[request.episode_key, observation.t]  # more draws on draw 0's context
        conversation = self.conversations.get(request.episode_key)
        if conversation is not None and conversation.next_t == observation.t:
            return conversation.context + self._suffix(observation, conversation.role)
        return observation_prompt_ids(self.tokenizer, observation, self.tools)

    def _suffix(self, observation: Any, role: Role) -> list[int]:
        from trainer_client.rollout.chat_template import tool_result_suffix
        from trainer_client.rollout.tools import TOOL_FOR_ROLE, render_instructions

        return tool_result_suffix(self.tokenizer, {"role": "tool", "name": TOOL_FOR_ROLE[role],
                                                   "content": render_instructions(observation)}, self.template)

    def record(self, request: TurnRequest, context: list[int], text: str) -> TokenTurn:
        """Read the turn ``text`` generated from ``context`` (decoded with special tokens) and, for
        draw 0, move the episode's conversation past it: continued after a tool call with object
        arguments, ended otherwise."""
        from trainer_client.evaluation.heldout import extend_context, own_text
        from trainer_client.evaluation.openai_tools import hermes_reply, read_tool_reply

        turn = own_text(text)
        reply = read_tool_reply(request.role, hermes_reply(turn))
        after = extend_context(self.tokenizer, context, text, None, request.role, self.template)
        if request.draw == 0:
            if reply.call is not None:
                self.conversations[request.episode_key] = _Conversation(after, request.observation.t + 1, request.role)
            else:
                self.conversations.pop(request.episode_key, None)
            self.turn_contexts[request.episode_key, request.observation.t] = context
        return TokenTurn(reply.action, reply.forfeit, turn, after)

    def episode_done(self, episode_key: str) -> None:
        """Forget an episode's contexts."""
        self.conversations.pop(episode_key, None)
        for key in [k for k in self.turn_contexts if k[0] == episode_key]:
            del self.turn_contexts[key]


@dataclass(eq=False)  # identity: membership tests must not compare token lists
class _Pending:
    context: list[int]
    temperature: float
    future: asyncio.Future[str]


class HFPolicy(Policy):
    """``hf:PATH`` (see the module docstring).

    Args:
        spec: the spec text (for reports).
        path: checkpoint directory, hub id, ``tiny`` or ``tiny-learning``.
        options: ``max_new_tokens``, ``batch_size``, ``seed``.
    """

    def __init__(self, spec: str, path: str, options: PolicyOptions) -> None:
        super().__init__(spec)
        from trainer_client.rollout.chat_template import training_chat_template
        from trainer_client.rollout.tool_calls import tool_callables

        self.options = options
        self.model, self.tokenizer = load_hf_model(path)
        self.layout = TokenConversations(self.tokenizer, tool_callables(), training_chat_template(self.tokenizer))
        self.pending: list[_Pending] = []
        self.worker: asyncio.Task[None] | None = None
        self.batches = 0
        self.lock = asyncio.Lock()  # one model: generation and scoring never overlap

    async def act(self, request: TurnRequest) -> TurnReply:
        self.counters["requests"] += 1
        context = self.layout.context(request)
        try:
            text = await self._generate(context, request.temperature)
        except Exception as exc:  # e.g. out of memory: this episode fails (not scored), the run goes on
            from env_server.client.failures import RequestFailure, first_lines

            self.counters["failed"] += 1
            failure = RequestFailure("generation_error", first_lines(f"{type(exc).__name__}: {exc}"))
            return TurnReply(None, [], error=failure.describe(), failure=failure)
        turn = self.layout.record(request, context, text)
        after = turn.after
        self.counters["prompt_tokens"] += len(context)
        self.counters["completion_tokens"] += len(after) - len(context)
        accept_prob = None
        if request.want_accept_prob and request.role is Role.VERIFIER:
            accept_prob = await self._accept_prob(context, after[len(context):], request.observation.t)
        prompt = self.tokenizer.decode(context, skip_special_tokens=False)
        return TurnReply(turn.action, [{"role": "prompt", "content": prompt}], generated=turn.generated,
                         prompt_tokens=len(context), completion_tokens=len(after) - len(context),
                         accept_prob=accept_prob, forfeit=turn.forfeit)

    async def _accept_prob(self, context: list[int], completion: list[int], t: int) -> float | None:
        from trainer_client.model.verdict_probs import verdict_accept_probs
        from trainer_client.rollout.segments import Segment, SegmentOwner

        segments = [[Segment(0, len(completion), SegmentOwner(t, Role.VERIFIER, True))]]
        async with self.lock:
            probs = await asyncio.to_thread(verdict_accept_probs, self.model, self.tokenizer, [context], [completion],
                                            segments)
        return probs[0]

    async def _generate(self, context: list[int], temperature: float) -> str:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending.append(_Pending(context, temperature, future))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self.pending:
            await asyncio.sleep(0.005)  # let the other episodes' requests of this round arrive
            temperature = self.pending[0].temperature
            batch = [p for p in self.pending if p.temperature == temperature][:self.options.batch_size]
            self.pending = [p for p in self.pending if p not in batch]
            self.batches += 1
            try:
                async with self.lock:
                    texts = await asyncio.to_thread(self._generate_batch, [p.context for p in batch], temperature)
            except Exception as exc:  # a failed batch fails its requests, not the run
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            for p, text in zip(batch, texts, strict=True):
                if not p.future.done():
                    p.future.set_result(text)

    def _generate_batch(self, contexts: list[list[int]], temperature: float) -> list[str]:
        import torch

        from trainer_client.evaluation.heldout import generate_turns

        if temperature > 0:
            torch.manual_seed(self.options.seed * 1_000_003 + self.batches)
        return [texts[0] for texts in generate_turns(self.model, self.tokenizer, contexts, sample=temperature > 0, num=1,
                                                      temperature=temperature, max_new_tokens=self.options.max_new_tokens)]

    def episode_done(self, episode_key: str) -> None:
        self.layout.episode_done(episode_key)
