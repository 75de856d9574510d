"""Hint distillation (SDPO): the policy at an error site, pulled toward itself shown the hint.

For a turn with an error-site marker (RFC 0002), the teacher context is the policy's own
context with a hint inserted as a user message right before the erring turn: per ``sdpo.hint``
the server's template for the turn's ``hint_template_key``, the turn's own localised hint
(``TurnReward.hint``), or the reference solution (OPSD, arXiv 2601.18734); with ``sdpo.restate``
the hint message ends with the turn's own instructions. Teacher logits come from the same model
without gradient. The term is the generalized Jensen-Shannon divergence of Agarwal et al. 2024
(GKD, arXiv 2306.13649, Eq. 1; TRL's ``GKDTrainer.generalized_jsd_loss``), on that turn's tokens
only:

    JSD_β(p_T ‖ p_S) = β · KL(p_T ‖ m) + (1 − β) · KL(p_S ‖ m),   m = β · p_T + (1 − β) · p_S

averaged over the sites' tokens (:func:`~trainer_client.losses.functional.masked_jsd_loss`).
No error site: no extra forward. The student side reuses the GRPO forward's hidden states,
and the teacher continues from that forward's keys and values, so only the hint and the erring
turn run again (:func:`~trainer_client.model.forward.response_hidden_after_prefix`), all sites
of a micro-batch in one batch. The divergence is computed from both sides' hidden states a
block of tokens at a time (:func:`~trainer_client.losses.functional.chunked_jsd_loss`): the
sites' ``(tokens, V)`` logits never exist whole, which at a 151,936-token vocabulary is what
decided the channel's memory.

The teacher is the live policy by default; ``sdpo.teacher_model_kind`` makes it the initial
policy (``base``) or an exponential moving average of the policy (``ema``), as TRL 1.16's SDPO
names them, and ``sdpo.use_successful_as_teacher`` adds a successful sibling rollout's action to
the hint (SDPO's reprompt, arXiv 2601.20802). A teacher other than the live policy runs its own
forward over the hinted context (its keys and values are not the GRPO forward's).
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
from accelerate.utils import is_peft_model
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from env_server.protocol.markers import Role
from trainer_client.losses.base import LossChannel, LossContext, ScoredBatch, register_channel
from trainer_client.losses.functional import chunked_jsd_loss, masked_jsd_loss
from trainer_client.losses.sdpo_teacher import (
    EMATeacherCallback,
    right_token_advantage,
    successful_sibling,
    teacher_disagrees,
)
from trainer_client.losses.settings import SUCCESSFUL_TEMPLATE, SDPOConfig
from trainer_client.model.forward import pack_responses, response_hidden, response_hidden_after_prefix
from trainer_client.trl_compat import CapturedForward, reference_adapter, restore_class_forward

__all__ = ["SDPOConfig", "SDPOHintDistillation", "chat_delta", "hint_message_ids", "reference_hint"]


def reference_hint(solution: str) -> str:
    """The teacher's privileged information in OPSD (on-policy self-distillation, arXiv
    2601.18734): the problem's reference solution, shown as a hint. A run that uses it is
    gold-supervised (its teacher knows the answer)."""
    return f"A correct solution: {solution}"


def chat_delta(processor: Any, base: list[dict[str, str]], added: list[dict[str, str]], generation_prompt: bool,
               **template_kwargs: Any) -> list[int]:
    """Token ids a chat template adds when ``added`` messages (and, optionally, the generation
    prompt) follow ``base``.

    Args:
        processor: a tokenizer or processor with ``apply_chat_template``.
        base, added: chat messages.
        generation_prompt: end with the assistant's generation prompt.
        template_kwargs: passed to ``apply_chat_template`` (``chat_template=...`` and the like).

    Raises:
        ValueError: the template is not prefix-preserving (``base`` renders differently once
            ``added`` follows).
    """
    kwargs = {"tokenize": True, "return_dict": False, **template_kwargs}
    prefix = cast("list[int]", processor.apply_chat_template(base, add_generation_prompt=False, **kwargs))
    full = cast("list[int]", processor.apply_chat_template(base + added, add_generation_prompt=generation_prompt, **kwargs))
    if list(full[: len(prefix)]) != list(prefix):
        raise ValueError("the chat template is not prefix-preserving; hint insertion needs one that is")
    return list(full[len(prefix):])


def hint_message_ids(processor: Any, hint: str, **template_kwargs: Any) -> tuple[list[int], list[int]]:
    """How a hint goes into a context that ends with the generation prompt, as
    :meth:`SDPOHintDistillation.hint_insertion` puts it there: ``(generation_prompt, inserted)``;
    the context's trailing ``generation_prompt`` ids are replaced by ``inserted`` (the hint as
    a user message, then a new generation prompt). Used by the tiny models' hint-following
    warm-up, so that its hinted turns are laid out token for token as the SDPO teacher's.

    Raises:
        ValueError: from :func:`chat_delta`.
    """
    base = [{"role": "user", "content": "x"}]
    return (chat_delta(processor, base, [], True, **template_kwargs),
            chat_delta(processor, base, [{"role": "user", "content": hint}], True, **template_kwargs))


#: The batch column holding, per rollout, ``(start, end, hint_key)`` of each error site.
SITES = "sdpo_sites"

#: Sites' own hint texts kept (most recent): far more than the sites of the generation batches
#: a step holds at once, so a prepared site's key is always still there.
_SITE_HINTS_KEPT = 8192


def _instructions(environment: Any, t: int) -> str | None:
    """The instructions turn ``t``'s role was shown (its ``TurnLog.observation``), or ``None``."""
    trace = getattr(environment, "trace", None)
    for log in getattr(trace, "turns", None) or []:
        if log.t == t:
            return cast("str | None", log.observation)
    return None


@register_channel("sdpo_hint_distill")
class SDPOHintDistillation(LossChannel):
    """SDPO hint distillation, the loss equation's ``sdpo_hint_distill`` term, as an
    :class:`~trainer_client.losses.base.LossChannel` (weight ``α``; registered as
    ``sdpo_hint_distill``).

    Args:
        config: the channel's settings (``sdpo`` in the config).
        hints: the server's hint templates, key -> text (``GET /hints``).
        reference_solution: ``problem_id -> reference solution`` (or ``None`` for a problem it
            does not know, whose sites then get the template); needed by ``hint: reference``.

    Raises:
        ValueError: ``alpha > 0`` without hint templates, or ``hint: reference`` without
            ``reference_solution``.
    """

    metric = "loss/sdpo_jsd"
    cost_key = "sdpo"

    def __init__(self, config: SDPOConfig, hints: dict[str, str],
                 reference_solution: Callable[[str], str | None] | None = None) -> None:
        super().__init__(config.alpha, config.roles)
        if config.alpha > 0 and not hints:
            raise ValueError("sdpo.alpha > 0 needs the hint templates (the env server's GET /hints)")
        if config.hint == "reference" and reference_solution is None:
            raise ValueError("sdpo.hint 'reference' needs the reference solutions (set `problems` in the train config)")
        self.reference_solution = reference_solution
        self.config = config
        self.hints = dict(hints)  # the templates (a copy: the caller's table is left alone)
        # the sites' own hint texts, most recent last; bounded, as every restated hint is new
        self._site_hints: OrderedDict[str, str] = OrderedDict()
        self._hint_ids: dict[str, list[int]] = {}
        #: the teacher's own weights (``base`` and ``ema`` without adapters); ``None``: the policy's
        self.teacher_model: torch.nn.Module | None = None
        self._sibling_hints = 0  # sites whose hint shows a successful sibling's action, this batch
        self._monitor: dict[str, float] = {}  # the teacher's measured advantage on the last batch's sites
        self._gate_counts = (0, 0)  # sdpo.gate: (sites kept, sites tested) in the current micro-batch

    def bind(self, trainer: Any) -> None:
        """Keep the trainer's processor, chat template and accelerator; tokenise the generation
        prompt; make the teacher's weights for ``teacher_model_kind`` ``base`` / ``ema``.

        Raises:
            ValueError: ``ema`` with LoRA adapters (an EMA of adapters is not wired).
        """
        self.trainer = trainer
        self._gen_prompt_ids = self._chat_delta([{"role": "user", "content": "x"}], [], generation_prompt=True)
        kind = self.config.teacher_model_kind
        if kind == "live" or self.config.alpha == 0:
            return
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        if is_peft_model(unwrapped):
            if kind == "ema":
                raise ValueError("sdpo.teacher_model_kind 'ema' is not wired with LoRA adapters; use 'base' (the "
                                 "adapters off) or 'live'")
            return  # base: the PEFT model with its adapters off
        self.teacher_model = copy.deepcopy(unwrapped)  # the policy at step 0
        restore_class_forward(self.teacher_model)
        self.teacher_model.requires_grad_(False)
        self.teacher_model.train(False)
        if kind == "ema":
            trainer.add_callback(EMATeacherCallback(self))

    @contextmanager
    def teacher(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The teacher's model (no gradient): ``model`` itself for ``live``; for ``base``
        under adapters ``model`` with them off; else the teacher's own copy."""
        if self.teacher_model is not None:
            yield self.teacher_model
        elif self.config.teacher_model_kind == "base":
            with reference_adapter(model):
                yield model
        else:
            yield model

    # ------------------------------------------------------------------ the batch

    def prepare(self, batch: ScoredBatch) -> torch.Tensor | None:
        """Write each rollout's error sites (``(start, end, hint_key)`` of every segment that
        produced an erring turn of one of :attr:`roles` with a known hint) into the batch.

        Returns:
            ``None``; with ``sdpo.route`` (SRPO's sample routing, arXiv 2604.02288) a ``(B, T)``
            multiplier of the GRPO loss mask (dtype of ``completion_mask``): 0 on the tokens
            ``[start, end)`` of every site, 1 elsewhere, so an erring turn is trained by
            distillation alone.
        """
        out = []
        environments = batch.environments or [None] * len(batch.records)
        self._sibling_hints = 0
        for row, (record, segs, environment) in enumerate(zip(batch.records, batch.segments, environments, strict=True)):
            sites = []
            if self.config.failed_only and record.episode_reward >= 1:
                segs = None  # a rollout that ended right: its erring turns are left to GRPO
            for seg in segs or []:
                if seg.owner is None or not seg.owner.produced or seg.owner.role not in self.roles:
                    continue
                turn = record.turns[seg.owner.t]
                if turn.error_kind is not None and turn.hint_template_key in self.hints and seg.end > seg.start:
                    hint = self._hint_text(record, turn)
                    sibling = self.successful_sibling(batch, row, turn.role, turn.t) \
                        if self.config.use_successful_as_teacher else None
                    if sibling is not None:
                        self._sibling_hints += 1
                        shown = SUCCESSFUL_TEMPLATE.format(solution=sibling)
                        hint = f"{hint or self.hints[turn.hint_template_key]}\n\n{shown}"
                    if self.config.restate:
                        instructions = _instructions(environment, seg.owner.t)
                        if instructions is not None:
                            hint = f"{hint or self.hints[turn.hint_template_key]}\n\n{instructions}"
                    sites.append((seg.start, seg.end, self.site_key(turn.hint_template_key, hint)))
            out.append(sites)
        batch.output[SITES] = out
        self._monitor = self.teacher_advantage(batch, out) if batch.mode == "train" else {}
        if not self.config.route:
            return None
        routed = torch.ones_like(batch.output["completion_mask"])
        for row, sites in enumerate(out):
            for start, end, _ in sites:
                routed[row, start:end] = 0
        return routed

    def successful_sibling(self, batch: ScoredBatch, row: int, role: Role, t: int) -> str | None:
        """:func:`~trainer_client.losses.sdpo_teacher.successful_sibling` of this trainer's batch."""
        return successful_sibling(self.trainer, batch, row, role, t)

    def batch_metrics(self) -> dict[str, float]:
        """``sdpo/sibling_hints`` (the batch's sites whose hint shows a successful sibling's
        action) and :meth:`teacher_advantage`'s figures."""
        sibling = {"sdpo/sibling_hints": float(self._sibling_hints)} if self.config.use_successful_as_teacher else {}
        return {**sibling, **self._monitor}

    def teacher_advantage(self, batch: ScoredBatch, sites: list[list[tuple[int, int, str]]]) -> dict[str, float]:
        """:func:`~trainer_client.losses.sdpo_teacher.right_token_advantage` of this channel's sites."""
        return right_token_advantage(self, batch, sites)

    def _hint_text(self, record: Any, turn: Any) -> str | None:
        """A site's own hint per ``sdpo.hint`` (``None``: the template)."""
        if self.config.hint == "localised":
            return cast("str | None", turn.hint)
        if self.config.hint == "reference" and turn.role is not Role.VERIFIER and self.reference_solution is not None:
            solution = self.reference_solution(record.problem_id)
            return None if solution is None else reference_hint(solution)
        return None

    def site_key(self, template_key: str, hint: str | None) -> str:
        """The key of a site's hint: ``template_key``, or for a hint of the site's own
        (localised, reference or restated) ``"<template_key>#<sha256 of hint, 12 hex>"``, kept
        among the last :data:`_SITE_HINTS_KEPT` such hints (the key keeps the erring role as its
        ``<role>/`` prefix, which per-role routing reads); :meth:`hint_text` reads it back."""
        if not hint:
            return template_key
        key = f"{template_key}#{hashlib.sha256(hint.encode()).hexdigest()[:12]}"
        self._site_hints[key] = hint
        self._site_hints.move_to_end(key)
        while len(self._site_hints) > _SITE_HINTS_KEPT:
            evicted, _ = self._site_hints.popitem(last=False)
            self._hint_ids.pop(evicted, None)
        return key

    def hint_text(self, key: str) -> str:
        """The text of a site's hint key (a template, or a site's own hint; an own hint evicted
        since its batch was prepared, which :data:`_SITE_HINTS_KEPT` makes unlikely, falls back
        to its template)."""
        if key in self.hints:
            return self.hints[key]
        if key in self._site_hints:
            return self._site_hints[key]
        return self.hints[key.partition("#")[0]]

    def wants_policy_forward(self, inputs: dict[str, Any]) -> bool:
        return any(inputs.get(SITES, []))

    # ------------------------------------------------------------------ hints in the chat template

    def _chat_delta(self, base: list[dict[str, str]], added: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        """Token ids the trainer's chat template adds when ``added`` follow ``base`` (:func:`chat_delta`)."""
        trainer = self.trainer
        template_kwargs = trainer.chat_template_kwargs
        assert isinstance(template_kwargs, dict), "TrainingArguments parses chat_template_kwargs into a dict"
        processor = trainer.processing_class
        assert isinstance(processor, (PreTrainedTokenizerBase, ProcessorMixin)), "a tokenizer or processor is needed"
        return chat_delta(processor, base, added, generation_prompt, chat_template=trainer.chat_template,
                          **template_kwargs)

    def with_hint(self, context: list[int], key: str) -> list[int]:
        """``context`` (ending with the generation prompt of the erring turn) with the hint
        inserted as a user message right before that turn."""
        kept, inserted = self.hint_insertion(context, key)
        return context[:kept] + inserted

    def hint_insertion(self, context: list[int], key: str) -> tuple[int, list[int]]:
        """How the hinted context is built from ``context``: ``(kept, inserted)`` for
        ``context[:kept] + inserted``. With a prefix-preserving chat template the generation
        prompt is dropped and the hint's user message plus a new generation prompt follow;
        otherwise the hint is appended as plain text."""
        if key not in self._hint_ids:
            self._hint_ids[key] = self._chat_delta([{"role": "user", "content": "x"}],
                                                   [{"role": "user", "content": self.hint_text(key)}], generation_prompt=True)
        gen = self._gen_prompt_ids
        if gen and context[-len(gen):] == gen:
            return len(context) - len(gen), list(self._hint_ids[key])
        hint_text = self.trainer.processing_class(f"Hint: {self.hint_text(key)}\n", add_special_tokens=False)["input_ids"]
        return len(context), list(hint_text)

    # ------------------------------------------------------------------ the loss

    def loss(self, model: torch.nn.Module, inputs: dict[str, Any],
             context: LossContext) -> tuple[torch.Tensor | None, dict[str, float]]:
        router = getattr(self.trainer, "role_router", None)
        self._gate_counts = (0, 0)
        if router is not None and router.adapter_routes:  # per-role adapters: each site under its role's
            value = self.routed_site_loss(model, inputs, router)
        else:
            value = self.site_loss(model, inputs, context.policy_forward)
        sites = self.sites(inputs)
        gated = {"sdpo/gate_kept": float(self._gate_counts[0])} if self.config.gate != "none" else {}
        return value, {self.metric: 0.0 if value is None else value.item(), "sdpo/sites": float(len(sites)),
                       "sdpo/site_tokens": float(sum(end - start for _, start, end, _ in sites)), **gated}

    def sites(self, inputs: dict[str, Any]) -> list[tuple[int, int, int, str]]:
        """The micro-batch's distilled sites: ``(row, start, end, hint key)`` with ``start``/``end``
        completion token offsets, at most ``max_sites_per_batch`` (the first ones, row order).
        Their count and token total are logged per micro-batch as ``sdpo/sites`` and
        ``sdpo/site_tokens`` (how much of a step the term's signal reaches)."""
        return [(row, start, end, key) for row, row_sites in enumerate(inputs.get(SITES, []))
                for start, end, key in row_sites][: self.config.max_sites_per_batch]

    def routed_site_loss(self, model: torch.nn.Module, inputs: dict[str, Any], router: Any) -> torch.Tensor | None:
        """:meth:`site_loss` with each site's student and teacher under the policy of the role
        that erred (``router.using(model, role)``; the role is the hint key's ``<role>/...``),
        one call per role, combined as the token-weighted mean ``Σ_r n_r · L_r / Σ_r n_r`` over
        the roles' site tokens ``n_r`` (the same mean as one call over all sites). Both sides run
        in full: the GRPO pass of each adapter covers other roles' tokens too."""
        rows = inputs.get(SITES, [])
        sites = self.sites(inputs)
        total, tokens = None, 0
        for role in dict.fromkeys(key.partition("/")[0] for *_, key in sites):
            chosen = [site for site in sites if site[3].partition("/")[0] == role]
            part = {**inputs, SITES: [[(s, e, k) for r, s, e, k in chosen if r == row] for row in range(len(rows))]}
            with router.using(model, Role(role)):
                value = self.site_loss(model, part, None)
            if value is None:
                continue
            count = sum(end - start for _, start, end, _ in chosen)
            total, tokens = (value * count if total is None else total + value * count), tokens + count
        return None if total is None else total / tokens

    def site_loss(self, model: torch.nn.Module, inputs: dict[str, Any],
                  policy_forward: CapturedForward | None = None) -> torch.Tensor | None:
        """Generalized JSD between the policy and its hint-conditioned self on erring turns.

        Args:
            model: the policy.
            inputs: the micro-batch (``sdpo_sites`` lists ``(start, end, hint_key)`` per row).
            policy_forward: the policy's GRPO forward over this micro-batch. Its ``(B, P + C, H)``
                final hidden states are the student side; its cache, where it kept one, holds
                the teacher's context before the hint, so the teacher runs only the hint and
                the turn. ``None`` runs both sides in full (the same values up to float order).

        Returns:
            The mean per-token divergence over the sites' tokens, or ``None`` without sites.
        """
        sites = self.sites(inputs)
        if not sites:
            return None
        prompt_ids, prompt_mask, completion_ids = inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"]
        prompt_width = prompt_ids.shape[1]
        contexts, insertions, responses = [], [], []
        for row, start, end, key in sites:
            context = prompt_ids[row][prompt_mask[row].bool()].tolist() + completion_ids[row][:start].tolist()
            contexts.append(context)
            insertions.append(self.hint_insertion(context, key))
            responses.append(completion_ids[row][start:end].tolist())
        pad = self.trainer.processing_class.pad_token_id
        device = completion_ids.device
        hinted = [context[:kept] + inserted for context, (kept, inserted) in zip(contexts, insertions, strict=True)]
        teacher = pack_responses(hinted, responses, pad, device)
        unwrapped = self.trainer.accelerator.unwrap_model(model)
        if policy_forward is not None:
            student_hidden = _site_hidden(policy_forward.hidden, sites, prompt_width, teacher.response_length)
        else:
            student_hidden = response_hidden(unwrapped, pack_responses(contexts, responses, pad, device))
        teacher_hidden, teacher_copy = self._teacher_side(unwrapped, teacher, policy_forward, sites, contexts,
                                                          insertions, responses, prompt_width)
        mask = teacher.mask
        if self.config.gate == "teacher_disagrees":
            kept = teacher_disagrees(unwrapped, student_hidden, teacher_hidden, teacher_copy, teacher)
            self._gate_counts = (self._gate_counts[0] + int(kept.sum()), self._gate_counts[1] + len(kept))
            if not kept.any():
                return None
            mask = mask & kept[:, None]
        head = cast("torch.nn.Module", unwrapped.get_output_embeddings())
        # a teacher with a head of its own (a base or ema copy's) scores through that head
        teacher_head = head if teacher_copy is None else \
            cast("torch.nn.Module", cast("Any", teacher_copy).get_output_embeddings())
        teacher_weight = None if teacher_copy is None else cast("torch.Tensor", teacher_head.weight)
        if self.config.backend == "liger":
            from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

            loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=self.config.jsd_beta,
                                              temperature=self.config.temperature, compiled=False)
            return loss_fn(student_hidden[mask], head.weight, teacher_hidden[mask], teacher_head.weight,
                           teacher.labels[mask])
        if getattr(head, "bias", None) is None and getattr(teacher_head, "bias", None) is None:
            # the erring tokens' logits a block at a time, never (n, L, V)
            weight = cast("torch.Tensor", head.weight)
            return chunked_jsd_loss(student_hidden[mask], teacher_hidden[mask], weight, beta=self.config.jsd_beta,
                                    temperature=self.config.temperature, token_clip=self.config.token_clip,
                                    teacher_weight=teacher_weight)
        with torch.no_grad():  # a head with a bias: full logits
            teacher_logits = teacher_head(teacher_hidden)
        return masked_jsd_loss(head(student_hidden), teacher_logits, mask, beta=self.config.jsd_beta,
                               temperature=self.config.temperature, token_clip=self.config.token_clip)


    def _teacher_side(self, unwrapped: Any, teacher: Any, policy_forward: CapturedForward | None,
                      sites: list[tuple[int, int, int, str]], contexts: list[list[int]],
                      insertions: list[tuple[int, list[int]]], responses: list[list[int]],
                      prompt_width: int) -> tuple[torch.Tensor, torch.nn.Module | None]:
        """The teacher's ``(n, L, H)`` hidden states over the hinted sites (no gradient), and
        the teacher's model when its head is not the policy's (a ``base``/``ema`` copy, whose
        head then scores them), else ``None``. The live teacher continues from the GRPO
        forward's cache where it kept one; any other teacher runs the hinted contexts in full."""
        with torch.no_grad():
            if self.config.teacher_model_kind != "live":
                with self.teacher(unwrapped) as model:
                    hidden = response_hidden(model, teacher)
                    head = cast("torch.nn.Module", cast("Any", model).get_output_embeddings())
                    return hidden, (model if head is not unwrapped.get_output_embeddings() else None)
            if policy_forward is not None and policy_forward.cache is not None:
                pad = self.trainer.processing_class.pad_token_id
                # the kept context ends where the dropped generation prompt (if any) began
                continued = response_hidden_after_prefix(
                    unwrapped, policy_forward, [row for row, *_ in sites],
                    [prompt_width + start - (len(context) - kept)
                     for (_, start, _, _), context, (kept, _) in zip(sites, contexts, insertions, strict=True)],
                    [kept for kept, _ in insertions], [inserted for _, inserted in insertions], responses, pad)
                if continued is not None:
                    return continued, None
            return response_hidden(unwrapped, teacher), None



def _site_hidden(hidden: torch.Tensor, sites: list[tuple], prompt_width: int, length: int) -> torch.Tensor:
    """``(n, L, H)`` hidden states predicting each site's tokens, right-aligned like
    :class:`~trainer_client.model.forward.ResponseBatch` (zeros before shorter sites)."""
    out = hidden.new_zeros((len(sites), length, hidden.shape[-1]))
    for i, (row, start, end, _) in enumerate(sites):
        n = end - start
        # completion token k sits at prompt_width + k and is predicted from the position before
        out[i, length - n:] = hidden[row, prompt_width + start - 1: prompt_width + end - 1]
    return out
