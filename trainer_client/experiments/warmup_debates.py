"""Scripted debates for the tiny models' supervised warm-up, played with the real environment code.

:func:`synthetic_debates` plays ``DebateEpisode`` locally with scripted actions and returns TRL
message lists. With ``hint_fraction > 0`` some turns are *hint-following* examples: the
server's hint for the error that turn's role would otherwise make (``HINT_TEMPLATES``, the text
:class:`~trainer_client.losses.hint_distillation.HintDistillation` inserts before an erring turn
in its teacher context) comes as a user message right before the turn, and the turn is then
the corrected one. That is how an instruction-following LLM reads such a hint, and what gives
hint distillation something to distil on a tiny model (a model that never saw a hint is a
different policy when shown one, not a better one).
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["HINT_MESSAGE", "hint_for_turn", "synthetic_debates"]

#: Marks a warm-up user message as a hint (the layout puts it where SDPO's teacher context does).
HINT_MESSAGE = "hint"


def _call(name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def hint_for_turn(role: str, answer_right: bool) -> str:
    """The hint-template key of the error a turn of ``role`` corrects in a hint-following
    example: ``solver/wrong_answer``, ``judge/wrong_answer``; for the verifier
    ``verifier/false_reject`` when the answer under review is right, else
    ``verifier/false_accept``."""
    if role == "verifier":
        return "verifier/false_reject" if answer_right else "verifier/false_accept"
    return f"{role}/wrong_answer"


def synthetic_debates(n: int, seed: int, max_rounds: int = 1, family: str | None = None,
                      answer_accuracy: float = 0.5, wrong_answers: tuple[int, int] | list[int] | str | None = None,
                      seed_base: int | None = None, worked: bool = False,
                      restate: bool = False, mode: str = "debate", hint_fraction: float = 0.0,
                      verdict_accuracy: float = 0.5, hint_style: str = "template",
                      restate_hints: bool = False) -> list[list[dict[str, Any]]]:
    """``n`` debates as TRL message lists (system, user, then assistant tool calls and tool
    results, then a closing assistant message), played locally with scripted actions.

    One round (solver, verifier, judge) by default: the shortest full debate, so the warm-up
    is cheap; later rounds repeat the same two tools.

    Args:
        n, seed, max_rounds: how many debates, the scripted actions' seed, rounds per debate.
        family: draw problems from this generator family only (``None``: the default rotation,
            problem seeds ``10_000 + seed * 100_000 + i``).
        answer_accuracy: probability that the scripted solver's answer is the right one.
        wrong_answers: ``(low, high)``: a wrong answer is drawn uniformly from these integers,
            never the right answer; ``"near"``: the right answer plus one of -10, -1, +1, +10
            (a carry or last-digit slip; integer answers); ``None``: from -50..200, possibly
            the right answer by chance.
        seed_base: first problem seed with ``family`` (problem ``i`` uses ``seed_base + i``).
        worked: a right answer comes with the problem's reference solution (its worked steps,
            ending in the boxed answer) instead of a one-word lead-in.
        restate: a worked solution starts by restating the problem verbatim.
        mode: ``"debate"`` or ``"single"`` (RFC 0006: the solver's one ``submit_solution``
            call on the single-mode solver prompt, then the tool's result, which is
            ``trainer_client.rollout.environment.DEBATE_OVER`` as in a real single-mode rollout, and the
            closing message).
        hint_fraction: probability that a turn is a hint-following example: a user message
            ``{"role": "user", "content": <hint>, "hint": <key>}`` (:data:`HINT_MESSAGE`)
            before it, and the turn right (solver and judge: the right answer, worked when
            ``worked``; verifier: the right verdict). Keys from :func:`hint_for_turn`.
        verdict_accuracy: probability that an unhinted verifier's verdict is the right one.
        hint_style: the hint of a hinted solver or judge turn: ``"template"`` (the hint
            template), ``"localised"`` (the server's localised hint,
            :func:`env_server.debate.error_sites.localised_hint`, for a carry or last-digit slip
            of the right answer where the family has one, else the template: what the rewards
            record's ``TurnReward.hint`` carries for such an error) or ``"reference"`` (the
            reference solution, :func:`~trainer_client.losses.hint_distillation.reference_hint`:
            OPSD's privileged information; a model warmed up on it is gold-supervised).
        restate_hints: the hint message ends with the turn's own instructions (as
            ``sdpo.restate`` lays out the SDPO teacher context), so the problem sits as far
            from the turn as without the hint.

    Raises:
        ValueError: an unknown ``mode`` or ``hint_style``, or ``hint_fraction`` outside [0, 1].
    """
    from env_server.debate.episode import DebateEpisode
    from env_server.debate.error_sites import localised_hint
    from env_server.debate.problems import ProblemGenerator
    from env_server.protocol.markers import HINT_TEMPLATES, EpisodeMode, Role
    from env_server.protocol.models import DebateAction, DebateObservation
    from trainer_client.losses.hint_distillation import reference_hint
    from trainer_client.rollout.tools import DEBATE_SYSTEM_PROMPT, render_instructions

    if hint_style not in ("template", "localised", "reference"):
        raise ValueError(f"hint_style: 'template', 'localised' or 'reference', not {hint_style!r}")
    if not 0.0 <= hint_fraction <= 1.0:
        raise ValueError(f"hint_fraction must be in [0, 1], got {hint_fraction}")
    rng = random.Random(seed)
    hint_rng = random.Random(f"hints/{seed}")  # a stream of its own: hint_fraction 0 leaves the debates as they were
    generator = ProblemGenerator() if family is None else ProblemGenerator(families=[family])
    first_seed = 10_000 + seed * 100_000 if seed_base is None else seed_base
    conversations = []

    def observation(episode: DebateEpisode) -> DebateObservation:
        return DebateObservation.model_validate(json.loads(episode.last_observation)["observation"])

    def solution(answer: str) -> str:
        text = rng.choice(["So", "Thus", "Hence"]) + f" \\boxed{{{answer}}}"
        if worked and answer == problem.answer:
            text = f"{problem.problem} {problem.solution}" if restate else problem.solution
        return text

    for i in range(n):
        problem = generator.by_seed(first_seed + i)
        episode = DebateEpisode(f"synthetic-{i}", problem, max_rounds=max_rounds, max_action_chars=4096,
                                mode=EpisodeMode(mode))
        messages: list[dict[str, Any]] = [{"role": "system", "content": DEBATE_SYSTEM_PROMPT},
                                          {"role": "user", "content": render_instructions(observation(episode))}]
        last_answer = problem.answer
        while not episode.done:
            role = episode.role
            assert role is not None, "an episode that is not done has a role to play"
            hinted = hint_fraction > 0 and hint_rng.random() < hint_fraction
            if hinted:
                key = hint_for_turn(role.value, last_answer == problem.answer)
                text = HINT_TEMPLATES[key]
                if hint_style == "localised" and role is not Role.VERIFIER:
                    slip = _wrong_answer(hint_rng, problem.answer, "near")
                    text = localised_hint(problem, role, "wrong_answer", slip) or text
                elif hint_style == "reference" and role is not Role.VERIFIER:
                    text = reference_hint(problem.solution)
                if restate_hints:
                    text = f"{text}\n\n{render_instructions(observation(episode))}"
                messages.append({"role": "user", "content": text, HINT_MESSAGE: key})
            if role is Role.SOLVER:
                right = hinted or rng.random() < answer_accuracy
                last_answer = problem.answer if right else _wrong_answer(rng, problem.answer, wrong_answers)
                arguments = {"solution": solution(last_answer)}
                content, name = arguments["solution"], "submit_solution"
            elif role is Role.VERIFIER:
                right_verdict = "CORRECT" if last_answer == problem.answer else "INCORRECT"
                if hinted or (verdict_accuracy != 0.5 and rng.random() < verdict_accuracy):
                    verdict = right_verdict
                elif verdict_accuracy != 0.5:
                    verdict = "INCORRECT" if right_verdict == "CORRECT" else "CORRECT"
                else:  # the original recipe's draw (kept so that existing warm-ups are unchanged)
                    verdict = rng.choice(["CORRECT", "INCORRECT"])
                arguments = {"verdict": verdict, "critique": rng.choice(["Checked.", "Step two is wrong.", "Fine."])}
                content, name = f"{arguments['critique']}\n\nVERDICT: {verdict}", "submit_verdict"
            else:
                answer = problem.answer if hinted else last_answer
                arguments = {"answer": answer}
                content, name = f"\\boxed{{{answer}}}", "submit_final_answer"
            episode.step(DebateAction(role=role, content=content))
            messages.append(_call(name, arguments))
            messages.append({"role": "tool", "name": name, "content": render_instructions(observation(episode))})
        messages.append({"role": "assistant", "content": "Done."})
        conversations.append(messages)
    return conversations


def _wrong_answer(rng: random.Random, answer: str, wrong_answers: tuple[int, int] | list[int] | str | None) -> str:
    if wrong_answers is None:
        return str(rng.randint(-50, 200))
    if isinstance(wrong_answers, str):
        if wrong_answers != "near":
            raise ValueError(f"wrong_answers: 'near', a (low, high) range or None, not {wrong_answers!r}")
        return str(int(answer) + rng.choice([-10, -1, 1, 10]))
    low, high = wrong_answers
    while (value := str(rng.randint(low, high))) == answer:
        pass
    return value
