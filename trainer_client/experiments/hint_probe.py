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
  without and with the hint, over all probed problems.

Error sites are the problems whose greedy unhinted answer is wrong (where SDPO would put the
hint in training). The hint goes in exactly as SDPO's teacher context has it
(:func:`~trainer_client.losses.hint_distillation.hint_message_ids`).
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
    """

    problems: int
    sites: int
    logp_gain: float
    share_higher: float
    accuracy_unhinted: float
    accuracy_hinted: float
    seconds: float

    def summary(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict."""
        return asdict(self)


def probe_hints(model: Any, tokenizer: Any, source: Any, seeds: Sequence[int], *, key: str = "solver/wrong_answer",
                max_new_tokens: int = 128, batch_size: int = 64) -> HintProbe:
    """Measure how the hint ``key`` changes the policy's first solver turn on ``source.by_seed(s)``.

    Args:
        model, tokenizer: the policy (a causal LM in the tool-call layout) and its tokenizer.
        source: the problem source; seeds: the problems (validation seeds).
        key: the hint template (``env_server.protocol.markers.HINT_TEMPLATES``).
        max_new_tokens, batch_size: greedy generation settings.

    Returns:
        A :class:`HintProbe`.

    Raises:
        ValueError: no seeds, or a chat template that is not prefix-preserving.
    """
    import torch

    from env_server.protocol.markers import HINT_TEMPLATES, Role
    from trainer_client.experiments.heldout import generate_turns, grade_answer_text, read_solver_turn, solver_prompt_ids
    from trainer_client.experiments.tiny_model import tool_callables, training_chat_template
    from trainer_client.losses.functional import sequence_logps
    from trainer_client.losses.hint_distillation import hint_message_ids
    from trainer_client.losses.replay_pairs import as_policy_writes, tool_call_message, tool_call_response_ids
    from trainer_client.model.forward import pack_responses, response_logits

    if not seeds:
        raise ValueError("probe_hints needs at least one problem seed")
    start = time.perf_counter()
    template = training_chat_template(tokenizer)
    generation_prompt, inserted = hint_message_ids(tokenizer, HINT_TEMPLATES[key], chat_template=template)
    tools = tool_callables()
    problems = [source.by_seed(s) for s in seeds]
    plain = [solver_prompt_ids(tokenizer, p, tools) for p in problems]
    if any(ids[-len(generation_prompt):] != generation_prompt for ids in plain):
        raise ValueError("the solver prompt does not end with the generation prompt: no place for the hint")
    hinted = [ids[: len(ids) - len(generation_prompt)] + inserted for ids in plain]
    was_training = model.training
    model.train(False)
    try:
        def accuracy(prompts: list[list[int]]) -> list[bool]:
            texts = []
            for i in range(0, len(prompts), batch_size):
                texts += [t[0] for t in generate_turns(model, tokenizer, prompts[i:i + batch_size], sample=False,
                                                       num=1, temperature=1.0, max_new_tokens=max_new_tokens)]
            turns = [read_solver_turn(t) for t in texts]
            return [t.valid and grade_answer_text(p.answer, t.answer) for t, p in zip(turns, problems, strict=True)]

        right_plain, right_hinted = accuracy(plain), accuracy(hinted)
        sites = [i for i, ok in enumerate(right_plain) if not ok]
        gains = []
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
            logps = []
            for contexts in ([plain[j] for j in chunk], [hinted[j] for j in chunk]):
                batch = pack_responses(contexts, correct, tokenizer.pad_token_id, device)
                with torch.no_grad():
                    logps.append(sequence_logps(response_logits(model, batch), batch.labels, batch.mask))
            lengths = torch.tensor([len(c) for c in correct], dtype=logps[0].dtype, device=device)
            gains += ((logps[1] - logps[0]) / lengths).tolist()
    finally:
        model.train(was_training)
    n = len(problems)
    return HintProbe(problems=n, sites=len(sites), logp_gain=sum(gains) / len(gains) if gains else 0.0,
                     share_higher=sum(g > 0 for g in gains) / len(gains) if gains else 0.0,
                     accuracy_unhinted=sum(right_plain) / n, accuracy_hinted=sum(right_hinted) / n,
                     seconds=time.perf_counter() - start)
