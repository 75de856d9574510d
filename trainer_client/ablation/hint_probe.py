"""Does the policy read hints? The check that hint distillation has something to distil.

Hint distillation (SDPO) pulls the policy at an error site toward itself shown the server's hint
(:mod:`trainer_client.losses.hint_distillation`). That only teaches when the hinted policy is a
*better* policy at those sites. :func:`probe_hints` measures it before any RL, on the solver's
first turn of each problem (validation problems, never the held-out set):

- ``logp_gain``: mean over error sites of the per-token log-probability of the correct
  continuation (the reference solution as the policy's own ``submit_solution`` call) with the
  hint ``solver/wrong_answer`` inserted, minus without it (nats per token); ``share_higher``:
  the share of sites where the hinted log-probability is higher;
- ``accuracy_unhinted`` / ``accuracy_hinted``: greedy first-answer accuracy of the same turn
  without and with the hint, over all probed problems;
- ``sites_fixed``: the share of error sites whose hinted greedy answer is right;
  ``right_broken``: the share of right unhinted answers that turn wrong with the hint (template
  hints only: the other styles hint only at an error site).

Error sites are the problems whose greedy unhinted answer is wrong (where SDPO would put the
hint in training). The hint goes in exactly as SDPO's teacher context has it
(:func:`~trainer_client.losses.hint_distillation.hint_message_ids`). ``style="localised"``
gives each site the hint the server's rewards record would carry for that wrong answer
(:func:`env_server.debate.error_sites.localised_hint`; the template where the family has none);
``style="reference"`` gives it the reference solution (OPSD's privileged information,
:func:`~trainer_client.losses.hint_distillation.reference_hint`); with either, the other
problems are not hinted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["HintProbe", "probe_hints"]


@dataclass(frozen=True)
class HintProbe:
    """The figures of :func:`probe_hints` (see the module docstring).

    Attributes:
        problems: problems probed; sites: of which error sites.
        logp_gain: mean hinted − unhinted log-prob per token of the correct turn at the sites (nats).
        share_higher: share of sites where the hinted log-prob is higher.
        accuracy_unhinted, accuracy_hinted: greedy first-answer accuracy without and with the hint.
        seconds: wall-clock of the probe.
        sites_fixed: share of sites whose hinted greedy answer is right.
        right_broken: share of right unhinted answers wrong with the hint (``None``: not template hints).
        style: the hints' style (``"template"``, ``"localised"``, ``"reference"``).
        restate: whether the hint message ended with the solver's instructions.
        per_site: one dict per error site: ``problem_id``, the ``answer`` it gave unhinted and
            ``hinted_answer``, whether that one is ``hinted_right``, the correct turn's
            ``tokens`` and its per-token log-probability under the student (``student_logp``,
            no hint) and the teacher (``teacher_logp``, hinted) and ``teacher_advantage``
            (teacher minus student, nats per token); and at the **right token**, the first
            token of the correct turn that is not the student's greedy choice there (where the
            student leaves the right path), ``right_token`` and the same three figures
            (``..._right_token``; ``None`` when the student's greedy choice follows the correct
            turn throughout). Left out of :meth:`summary`.
    """

    problems: int
    sites: int
    logp_gain: float
    share_higher: float
    accuracy_unhinted: float
    accuracy_hinted: float
    seconds: float
    sites_fixed: float = 0.0
    right_broken: float | None = None
    style: str = "template"
    restate: bool = False
    per_site: tuple[dict[str, Any], ...] = ()

    def summary(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict (without ``per_site``)."""
        out = asdict(self)
        out.pop("per_site")
        return out


def probe_hints(model: Any, tokenizer: Any, source: Any, seeds: Sequence[int], *, key: str = "solver/wrong_answer",
                max_new_tokens: int = 128, batch_size: int = 64, style: str = "template",
                restate: bool = False) -> HintProbe:
    """Measure how the hint ``key`` changes the policy's first solver turn on ``source.by_seed(s)``.

    Args:
        model, tokenizer: the policy (a causal LM in the tool-call layout) and its tokenizer.
        source: the problem source; seeds: the problems (validation seeds).
        key: the hint template (``env_server.protocol.markers.HINT_TEMPLATES``).
        max_new_tokens, batch_size: greedy generation settings.
        style: ``"template"`` (``key``'s template on every problem), ``"localised"`` or
            ``"reference"`` (see above).
        restate: the hint message ends with the solver's instructions (``sdpo.restate``).

    Returns:
        A :class:`HintProbe`.

    Raises:
        ValueError: no seeds, an unknown ``style``, or a chat template that is not prefix-preserving.
    """
    import torch
    from trl.trainer.utils import selective_log_softmax

    from env_server.debate.error_sites import localised_hint
    from env_server.protocol.markers import HINT_TEMPLATES, ErrorKind, Role
    from trainer_client.evaluation.heldout import (
        generate_turns,
        grade_answer_text,
        read_solver_turn,
        solver_instructions,
        solver_prompt_ids,
    )
    from trainer_client.losses.functional import sequence_logps
    from trainer_client.losses.hint_distillation import hint_message_ids, reference_hint
    from trainer_client.losses.replay_pairs import as_policy_writes, tool_call_message, tool_call_response_ids
    from trainer_client.model.forward import pack_responses, response_logits
    from trainer_client.rollout.chat_template import training_chat_template
    from trainer_client.rollout.tool_calls import tool_callables

    if not seeds:
        raise ValueError("probe_hints needs at least one problem seed")
    if style not in ("template", "localised", "reference"):
        raise ValueError(f"style: 'template', 'localised' or 'reference', not {style!r}")
    start = time.perf_counter()
    template = training_chat_template(tokenizer)
    tools = tool_callables()
    problems = [source.by_seed(s) for s in seeds]
    plain = [solver_prompt_ids(tokenizer, p, tools) for p in problems]
    insertions: dict[str, tuple[list[int], list[int]]] = {}

    def with_hint(ids: list[int], text: str) -> list[int]:
        if text not in insertions:
            insertions[text] = hint_message_ids(tokenizer, text, chat_template=template)
        generation_prompt, inserted = insertions[text]
        if ids[-len(generation_prompt):] != generation_prompt:
            raise ValueError("the solver prompt does not end with the generation prompt: no place for the hint")
        return ids[: len(ids) - len(generation_prompt)] + inserted

    was_training = model.training
    model.train(False)
    try:
        hinted_answers: dict[int, str | None] = {}

        def answers(prompts: list[list[int]], asked: list[Any]) -> list[tuple[bool, str | None]]:
            texts = []
            for i in range(0, len(prompts), batch_size):
                texts += [t[0] for t in generate_turns(model, tokenizer, prompts[i:i + batch_size], sample=False,
                                                       num=1, temperature=1.0, max_new_tokens=max_new_tokens)]
            turns = [read_solver_turn(t) for t in texts]
            return [(t.valid and grade_answer_text(p.answer, t.answer), t.answer if t.valid else None)
                    for t, p in zip(turns, asked, strict=True)]

        unhinted = answers(plain, problems)
        right_plain = [ok for ok, _ in unhinted]
        sites = [i for i, ok in enumerate(right_plain) if not ok]
        texts: list[str | None] = [HINT_TEMPLATES[key]] * len(problems)
        if style != "template":
            texts = [None] * len(problems)
            for i in sites:
                texts[i] = (reference_hint(problems[i].solution) if style == "reference" else
                            localised_hint(problems[i], Role.SOLVER, ErrorKind.WRONG_ANSWER, unhinted[i][1])
                            or HINT_TEMPLATES[key])
        if restate:
            texts = [None if text is None else f"{text}\n\n{solver_instructions(problems[i])}"
                     for i, text in enumerate(texts)]
        hinted = [plain[i] if text is None else with_hint(plain[i], text) for i, text in enumerate(texts)]
        shown = [i for i, text in enumerate(texts) if text is not None]
        right_hinted = list(right_plain)
        for i, (ok, said) in zip(shown, answers([hinted[i] for i in shown], [problems[i] for i in shown]), strict=True):
            right_hinted[i], hinted_answers[i] = ok, said
        gains, per_site = [], []
        device = next(model.parameters()).device
        for i in range(0, len(sites), batch_size):
            chunk = sites[i:i + batch_size]
            correct = []
            for j in chunk:
                message = tool_call_message(Role.SOLVER, problems[j].solution)
                assert message is not None, "a solver message always exists"
                rendered = tool_call_response_ids(tokenizer, message, chat_template=template,
                                                  eos_token_id=tokenizer.eos_token_id)
                correct.append(as_policy_writes(tokenizer, rendered, []))  # as a policy that does not reason
            logps, token_logps = [], []
            for contexts in ([plain[j] for j in chunk], [hinted[j] for j in chunk]):
                batch = pack_responses(contexts, correct, tokenizer.pad_token_id, device)
                with torch.no_grad():
                    logits = response_logits(model, batch)
                    logps.append(sequence_logps(logits, batch.labels, batch.mask))
                    token_logps.append(selective_log_softmax(logits, batch.labels))
                    if not token_logps[1:]:  # the student's: where it leaves the right turn first
                        off = batch.mask & (logits.argmax(-1) != batch.labels)
                        first = [int(row.nonzero()[0]) if row.any() else None for row in off]
                        labels = batch.labels
            lengths = torch.tensor([len(c) for c in correct], dtype=logps[0].dtype, device=device)
            gains += ((logps[1] - logps[0]) / lengths).tolist()
            for k, j in enumerate(chunk):
                at = first[k]
                student: float | None = None if at is None else float(token_logps[0][k, at])
                teacher: float | None = None if at is None else float(token_logps[1][k, at])
                per_site.append({
                    "problem_id": problems[j].problem_id, "answer": unhinted[j][1],
                    "hinted_answer": hinted_answers.get(j), "hinted_right": right_hinted[j],
                    "tokens": len(correct[k]), "student_logp": float(logps[0][k] / lengths[k]),
                    "teacher_logp": float(logps[1][k] / lengths[k]),
                    "teacher_advantage": float((logps[1][k] - logps[0][k]) / lengths[k]),
                    "right_token": None if at is None else tokenizer.decode([int(labels[k, at])]),
                    "student_logp_right_token": student, "teacher_logp_right_token": teacher,
                    "teacher_advantage_right_token": None if student is None or teacher is None else teacher - student})
    finally:
        model.train(was_training)
    right = [i for i, ok in enumerate(right_plain) if ok]
    n = len(problems)
    return HintProbe(problems=n, sites=len(sites), logp_gain=sum(gains) / len(gains) if gains else 0.0,
                     share_higher=sum(g > 0 for g in gains) / len(gains) if gains else 0.0,
                     accuracy_unhinted=sum(right_plain) / n, accuracy_hinted=sum(right_hinted) / n,
                     seconds=time.perf_counter() - start,
                     sites_fixed=sum(right_hinted[i] for i in sites) / len(sites) if sites else 0.0,
                     right_broken=None if style != "template" else (sum(not right_hinted[i] for i in right) / len(right)
                                                          if right else 0.0),
                     style=style, restate=restate, per_site=tuple(per_site))
