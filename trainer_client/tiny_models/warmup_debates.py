"""Scripted debates for the tiny models' supervised warm-up, played with the real environment code.

:func:`synthetic_debates` plays ``DebateEpisode`` locally with scripted actions and returns TRL
message lists. With ``hint_fraction > 0`` some turns are *hint-following* examples: the
server's hint for the error that turn's role would otherwise make (``HINT_TEMPLATES``, the text
:class:`~trainer_client.losses.hint_distillation.SDPOHintDistillation` inserts before an erring turn
in its teacher context) comes as a user message right before the turn, and the turn is then
the corrected one. That is how an instruction-following LLM reads such a hint, and what gives
hint distillation something to distil on a tiny model (a model that never saw a hint is a
different policy when shown one, not a better one).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

__all__ = ["HINT_MESSAGE", "column_check", "column_solution", "division_fact_drills", "division_facts", "hint_for_turn",
           "synthetic_debates"]

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
                      restate_hints: bool = False, verifier: str = "coin", judge: str = "copy",
                      verifier_accuracy: float = 1.0, hint_roles: tuple[str, ...] | list[str] | None = None
                      ) -> list[list[dict[str, Any]]]:
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
            the right answer by chance; ``"carry"`` (a family of :data:`WORKINGS`; for
            ``exact_division`` the dropped remainder, :class:`DivisionWorking`): the working of
            :func:`column_solution` with the tens column's carry forgotten (the answer 10 less
            than the right one), drawn only on a problem whose ones column carries, with
            probability ``1 - answer_accuracy``; a problem without a carry is always answered
            right (its working has no carry to forget). Every solver turn is then worked.
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
        verifier: ``"coin"`` (a one-line critique, the verdict right with probability
            ``verdict_accuracy``) or ``"worked"`` (a family of :data:`WORKINGS`; ``exact_division``
            multiplies the answer back, :class:`DivisionWorking`; ``two_digit_sum``: the critique works the sum
            column by column itself (:func:`column_check`), keeping the carry with probability
            ``verifier_accuracy``, then quotes the solution's answer; the verdict is CORRECT exactly when the two agree:
            a verifier whose verdict follows from its own check). The critique comes before the
            verdict in the call's arguments, so the check is written before the verdict.
        judge: ``"copy"`` (the last answer, or the right one when hinted) or ``"verdict"`` (the
            judge concludes from the debate: the solver's answer when the verdict is CORRECT,
            else the sum the verifier's critique worked out; needs ``verifier="worked"``).
        hint_roles: the roles whose turns may be hint-following examples (``None``: every role).
            With ``wrong_answers="carry"`` a solver turn is hinted only where it would slip: the
            hint is then the server's localised hint for the slipped answer.

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
    if verifier not in ("coin", "worked") or judge not in ("copy", "verdict"):
        raise ValueError(f"verifier: 'coin' or 'worked', judge: 'copy' or 'verdict'; got {verifier!r}, {judge!r}")
    if judge == "verdict" and verifier != "worked":
        raise ValueError("judge='verdict' concludes from the verifier's worked sum: it needs verifier='worked'")
    carry = wrong_answers == "carry"
    if (carry or verifier == "worked") and family not in WORKINGS:
        raise ValueError(f"the carry slip and the worked verifier are defined for family in {sorted(WORKINGS)} only")
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
        checked = problem.answer  # the answer the worked verifier arrived at
        last_verdict = "CORRECT"
        # family is one of WORKINGS whenever the carry slip or the worked verifier is on (checked above)
        working = WORKINGS[family](problem.problem) if (carry or verifier == "worked") and family else None
        has_carry = working is not None and working.can_slip
        while not episode.done:
            role = episode.role
            assert role is not None, "an episode that is not done has a role to play"
            slips = False  # a carry-model solver turn that forgets the carry
            if carry and role is Role.SOLVER:
                slips = has_carry and rng.random() >= answer_accuracy
            hinted = (hint_fraction > 0 and (hint_roles is None or role.value in hint_roles)
                      and (not carry or role is not Role.SOLVER or slips) and hint_rng.random() < hint_fraction)
            if hinted and carry and role is Role.SOLVER:
                assert working is not None
                text = localised_hint(problem, role, "wrong_answer", working.answer(False)) or ""
                if restate_hints:
                    text = f"{text}\n\n{render_instructions(observation(episode))}"
                messages.append({"role": "user", "content": text, HINT_MESSAGE: "solver/wrong_answer"})
            elif hinted:
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
            if role is Role.SOLVER and carry:
                assert working is not None
                kept = hinted or not slips
                arguments = {"solution": working.solution(kept)}
                last_answer = working.answer(kept)
                content, name = arguments["solution"], "submit_solution"
            elif role is Role.SOLVER:
                right = hinted or rng.random() < answer_accuracy
                last_answer = problem.answer if right else _wrong_answer(rng, problem.answer, wrong_answers)
                arguments = {"solution": solution(last_answer)}
                content, name = arguments["solution"], "submit_solution"
            elif role is Role.VERIFIER and verifier == "worked":
                assert working is not None
                kept = hinted or not working.check_can_slip(last_answer) or rng.random() < verifier_accuracy
                agrees = working.agrees(last_answer, kept)
                # a failed check that redoes the division may slip there too (drawn only then: the sums never redo)
                redo_kept = (agrees or not working.redoes or hinted or not working.can_slip
                             or rng.random() < verifier_accuracy)
                critique, checked = working.check(last_answer, kept, redo_kept)
                verdict = last_verdict = "CORRECT" if agrees else "INCORRECT"
                arguments = {"critique": critique, "verdict": verdict}
                content, name = f"{critique}\n\nVERDICT: {verdict}", "submit_verdict"
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
                if judge == "verdict":
                    answer = problem.answer if hinted else (last_answer if last_verdict == "CORRECT" else checked)
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


_OPERANDS = re.compile(r"Compute \$(\d{2}) \+ (\d{2})\$\.")


def _operands(statement: str) -> tuple[int, int]:
    """``(a, b)`` of a ``two_digit_sum`` statement ``Compute $a + b$.``

    Raises:
        ValueError: another statement.
    """
    match = _OPERANDS.fullmatch(statement)
    if match is None:
        raise ValueError(f"not a two_digit_sum statement: {statement!r}")
    return int(match.group(1)), int(match.group(2))


def column_solution(a: int, b: int, carry_kept: bool = True) -> str:
    """The worked sum of two two-digit numbers as the ``two_digit_sum`` reference solution works it
    (ones, then tens with the carry, then the sum), without the final boxed sentence; with
    ``carry_kept=False`` the tens column adds 0 in place of the ones column's carry (the slip
    of the ``"carry"`` error model: the sum comes out 10 too small when the ones column carries)."""
    ones = a % 10 + b % 10
    carried = ones // 10 if carry_kept else 0
    tens = a // 10 + b // 10 + carried
    total = tens * 10 + ones % 10
    return f"Ones: ${a % 10} + {b % 10} = {ones}$. Tens: ${a // 10} + {b // 10} + {carried} = {tens}$. So ${a} + {b} = {total}$."


def column_check(a: int, b: int, carry_kept: bool = True) -> str:
    """The worked verifier's own check of ``a + b``, in words of its own (not the solver's
    ``Ones: ... Tens: ...``): ``Check: ones $8 + 7 = 15$, carry 1; tens $8 + 1 + 1 = 10$. The sum is
    $105$.`` With ``carry_kept=False`` the carry is written 0 (the verifier's own slip).

    Why its own words: with the solver's format, a 2-layer model blends the two roles' carry rates
    at the one token where the carry is decided (the verifier's data kept the carry more often
    than the solver's, and the warmed-up solver then carried as often as the verifier: 88% greedy
    on validation problems, not the recipe's rate); distinct text around that token lets each
    role keep its own rate."""
    ones = a % 10 + b % 10
    carried = ones // 10 if carry_kept else 0
    tens = a // 10 + b // 10 + carried
    total = tens * 10 + ones % 10
    return (f"Check: ones ${a % 10} + {b % 10} = {ones}$, carry {carried}; tens ${a // 10} + {b // 10} + {carried} = "
            f"{tens}$. The sum is ${total}$.")


def _box(operands: tuple[int, int], carry_kept: bool) -> str:
    a, b = operands
    total = a + b - (0 if carry_kept or a % 10 + b % 10 < 10 else 10)
    return f" So the answer is $\\boxed{{{total}}}$."


class SumWorking:
    """``two_digit_sum``'s worked turns: the solver's column sum and its carry slip
    (:func:`column_solution`), the verifier's own column sum (:func:`column_check`), whose
    verdict is CORRECT exactly when its sum is the solution's answer (checking is redoing)."""

    def __init__(self, statement: str) -> None:
        self.a, self.b = _operands(statement)
        #: whether the solver's working can slip (the ones column carries)
        self.can_slip = self.a % 10 + self.b % 10 >= 10

    def solution(self, kept: bool) -> str:
        """The solver's worked solution, ending in the boxed answer; ``kept=False``: the slip."""
        return column_solution(self.a, self.b, carry_kept=kept) + _box((self.a, self.b), kept)

    def answer(self, kept: bool) -> str:
        """The answer :meth:`solution` arrives at."""
        return str(self.a + self.b - (0 if kept else 10 * self.can_slip))

    def check_can_slip(self, answer: str) -> bool:
        """Whether the verifier's check of ``answer`` can slip (its own sum carries)."""
        return self.can_slip

    #: the verifier never redoes anything after its check (the check is the redo)
    redoes = False

    def agrees(self, answer: str, kept: bool) -> bool:
        """Whether the verifier's sum (``kept=False``: its carry written 0) is ``answer``."""
        return str(self.a + self.b - (0 if kept else 10)) == answer

    def check(self, answer: str, kept: bool, redo_kept: bool = True) -> tuple[str, str]:
        """``(critique, the verifier's answer)``: the sum worked again (``kept=False``: the carry
        written 0), then the solution's answer quoted; ``redo_kept`` is unused."""
        checked = str(self.a + self.b - (0 if kept else 10))
        return f"{column_check(self.a, self.b, carry_kept=kept)} The solution's answer is {answer}.", checked


class DivisionWorking:
    """``exact_division``'s worked turns, where checking is cheaper than solving (issue 54).

    - The solver works the long division (:func:`division_solution`); its slip forgets the tens
      step's remainder when bringing down the ones digit (the ones digit of the quotient comes
      out wrong), possible only where that remainder is not 0.
    - The verifier checks by multiplying the solution's answer back (:func:`product_check`:
      two one-digit products and a carry) and says CORRECT exactly when the product is the
      dividend; its slip forgets the carry, possible only where the ones product carries. On a
      product that differs it redoes the division in its own words (:func:`division_redo`,
      slipping as the solver does), so that a judge that concludes from the debate has an answer
      to take.
    """

    def __init__(self, statement: str) -> None:
        from env_server.debate.problems.generator import long_division_steps

        self.dividend, self.divisor = _division_operands(statement)
        self.steps = long_division_steps(self.dividend, self.divisor)
        #: whether the solver's working can slip (the tens step leaves a remainder)
        self.can_slip = self.steps[0][2] != 0

    def solution(self, kept: bool) -> str:
        """The solver's worked solution, ending in the boxed answer; ``kept=False``: the slip."""
        return division_solution(self.dividend, self.divisor, remainder_kept=kept) + \
            f" So the answer is $\\boxed{{{self.answer(kept)}}}$."

    def answer(self, kept: bool) -> str:
        """The answer :meth:`solution` arrives at."""
        (_, tens, carried), _ = self.steps
        return str(10 * tens + ((carried if kept else 0) * 10 + self.dividend % 10) // self.divisor)

    def check_can_slip(self, answer: str) -> bool:
        """Whether the product check of ``answer`` can slip (its ones product carries)."""
        return int(answer) % 10 * self.divisor >= 10

    #: after a failed check the verifier redoes the division (:func:`division_redo`)
    redoes = True

    def agrees(self, answer: str, kept: bool) -> bool:
        """Whether ``answer`` times the divisor (``kept=False``: the carry dropped) is the dividend."""
        return product_of(int(answer), self.divisor, carry_kept=kept) == self.dividend

    def check(self, answer: str, kept: bool, redo_kept: bool = True) -> tuple[str, str]:
        """``(critique, the verifier's answer)``: ``answer`` times the divisor (``kept=False``: the
        carry written 0) against the dividend; where they differ, the division redone
        (``redo_kept``: whether the redo keeps the remainder) and its quotient the answer."""
        critique = product_check(int(answer), self.divisor, self.dividend, carry_kept=kept)
        if self.agrees(answer, kept):
            return critique, answer
        return f"{critique} {division_redo(self.dividend, self.divisor, remainder_kept=redo_kept)}", self.answer(redo_kept)


#: Family -> its worked turns (``wrong_answers="carry"``, ``verifier="worked"``).
WORKINGS: dict[str, Any] = {"two_digit_sum": SumWorking, "exact_division": DivisionWorking}

_DIVISION = re.compile(r"Compute \$(\d{2,3}) \\div (\d)\$\.")


def _division_operands(statement: str) -> tuple[int, int]:
    """``(dividend, divisor)`` of an ``exact_division`` statement ``Compute $n \\div d$.``

    Raises:
        ValueError: another statement.
    """
    match = _DIVISION.fullmatch(statement)
    if match is None:
        raise ValueError(f"not an exact_division statement: {statement!r}")
    return int(match.group(1)), int(match.group(2))


def division_solution(dividend: int, divisor: int, remainder_kept: bool = True) -> str:
    """The long division as the ``exact_division`` reference solution works it, without the
    final boxed sentence; ``remainder_kept=False`` brings the ones digit down without the tens
    step's remainder (the solver's slip: the quotient's ones digit comes out wrong)."""
    from env_server.debate.problems.generator import long_division_steps

    (lead, tens, carried), _ = long_division_steps(dividend, divisor)
    part = (carried if remainder_kept else 0) * 10 + dividend % 10
    ones = part // divisor
    quotient = 10 * tens + ones
    return (f"Tens: ${lead} \\div {divisor} = {tens}$ remainder ${carried}$. Ones: ${part} \\div {divisor} = {ones}$. "
            f"So ${dividend} \\div {divisor} = {quotient}$.")


def division_redo(dividend: int, divisor: int, remainder_kept: bool = True) -> str:
    """The verifier's own long division after a failed check, in words of its own (as
    :func:`column_check` is for the sums: distinct text keeps each role's slip rate its own)."""
    from env_server.debate.problems.generator import long_division_steps

    (lead, tens, carried), _ = long_division_steps(dividend, divisor)
    part = (carried if remainder_kept else 0) * 10 + dividend % 10
    return (f"Redo: {lead} over {divisor} gives {tens} left {carried}; {part} over {divisor} gives {part // divisor}. "
            f"The quotient is ${10 * tens + part // divisor}$.")


def product_of(quotient: int, divisor: int, carry_kept: bool = True) -> int:
    """``quotient × divisor`` as :func:`product_check` works it (``carry_kept=False``: the ones
    product's carry is dropped from the tens product)."""
    ones = quotient % 10 * divisor
    return (quotient // 10 * divisor + (ones // 10 if carry_kept else 0)) * 10 + ones % 10


def product_check(quotient: int, divisor: int, dividend: int, carry_kept: bool = True) -> str:
    """The verifier's check of a quotient: ``Check: $5 \\times 7 = 35$, write 5 carry 3; $6
    \\times 7 + 3 = 45$. The product is $455$, the dividend $455$.`` With ``carry_kept=False``
    the carry is written 0 (the verifier's own slip)."""
    ones = quotient % 10 * divisor
    carried = ones // 10 if carry_kept else 0
    tens = quotient // 10 * divisor + carried
    return (f"Check: ${quotient % 10} \\times {divisor} = {ones}$, write {ones % 10} carry {carried}; "
            f"${quotient // 10} \\times {divisor} + {carried} = {tens}$. The product is "
            f"${product_of(quotient, divisor, carry_kept)}$, the dividend ${dividend}$.")


def division_facts() -> list[tuple[str, int, int, int, int]]:
    """The division table that ``exact_division``'s long division reads from: ``(step, part,
    divisor, digit, remainder)`` with ``digit = part // divisor``, ``remainder = part % divisor``.

    - ``"Tens"``: every leading part a dividend can have, ``part`` in ``d .. 10d - 1`` for each
      divisor ``d`` in 2..9 (396 facts; a dividend ``10d .. 99d`` has ``part = dividend // 10``);
    - ``"Ones"``: the exact ones steps of a right working, ``part = b·d`` for ``b`` in 0..9 (80).

    These are the family's "times tables" (as the 100 column facts are the sums'): a held-out
    problem composes two of them, and no list of them names a problem (a dividend and divisor).
    """
    tens = [("Tens", part, d, part // d, part % d) for d in range(2, 10) for part in range(d, 10 * d)]
    ones = [("Ones", b * d, d, b, 0) for d in range(2, 10) for b in range(10)]
    return tens + ones


def division_fact_drills(n: int, seed: int, facts_per_drill: int = 8) -> list[tuple[str, list[tuple[int, int]]]]:
    """``n`` short drills of :func:`division_facts`, each ``facts_per_drill`` facts drawn at random
    (``random.Random(seed)``) and written as the solver's working writes them inside its tool
    call's JSON argument (``Tens: $45 \\\\div 7 = 6$ remainder $3$. Ones: $35 \\\\div 7 = 5$.``, the
    backslash escaped as ``json.dumps`` escapes it in the rollout).

    Returns:
        ``(text, spans)`` per drill: ``spans`` are the ``[start, end)`` character ranges of the
        answer digits (each quotient digit and remainder), the only characters a warm-up trains
        on (the parts and divisors are the drill's given, not something to predict).
    """
    facts = division_facts()
    rng = random.Random(seed)
    drills = []
    for _ in range(n):
        text, spans = "", []
        for step, part, divisor, digit, remainder in rng.choices(facts, k=facts_per_drill):
            text += json.dumps(f"{step}: ${part} \\div {divisor} = ")[1:-1]
            spans.append((len(text), len(text) + len(str(digit))))
            text += str(digit)
            if step == "Tens":
                text += "$ remainder $"
                spans.append((len(text), len(text) + len(str(remainder))))
                text += str(remainder)
            text += "$. "
        drills.append((text.rstrip(), spans))
    return drills


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
