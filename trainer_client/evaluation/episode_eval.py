"""Whole debates played by one policy against the server's own episode code: the final answer's
accuracy, greedy or sampled, and the debate's own figures (the verifier's verdicts, the judge).

The model plays every role, turn by turn, in the token layout of TRL's tool loop (the same layout
:mod:`trainer_client.evaluation.heldout` uses for the first answer), against
:class:`~env_server.debate.episode.DebateEpisode`; answers are graded with the server's grader and
``G`` computed by the server's rewards rule. Model output is never evaluated as code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

from env_server.debate.problems import ProblemSource
from trainer_client.evaluation.heldout import extend_context, generate_turns, grade_answer_text, own_text, solver_prompt_ids
from trainer_client.rollout.tool_calls import role_tool_action

__all__ = ["EpisodeReport", "evaluate_episodes"]


@dataclass
class EpisodeReport:
    """Whole-debate evaluation (:func:`evaluate_episodes`): greedy, or ``k`` sampled debates per problem.

    Attributes:
        n: problems.
        k: debates per problem (1 when greedy).
        temperature: the sampling temperature (``None`` when greedy).
        episode_reward: mean episode reward ``G`` by the server's rule
            (:func:`env_server.debate.rewards.episode_rewards_data`) over the ``n * k`` debates;
            ``G`` is whether the debate's final answer is right, so this is the final accuracy.
        finished_rate: share of debates in which every turn was a valid call of the acting
            role's tool (the others were finished by forfeits, as the adapter does in training).
        judge_accuracy: share of debates whose judge boxed a correct answer (``None`` in
            ``single`` mode: there is no judge).
        first_answer_accuracy: share of debates whose solver's first answer was right (a turn
            that is not a valid call counts as its text, as the adapter submits it).
        verdict_accuracy_right: share of the verifier turns reviewing a right answer that said
            CORRECT (``None`` when none reviewed a right answer, and in ``single`` mode).
        verdict_accuracy_wrong: share of the verifier turns reviewing a wrong answer that said
            INCORRECT (``None`` likewise).
        balanced_verdict_accuracy: the mean of the two (``None`` unless both are known): a
            verifier that always says the same verdict scores 0.5, whatever the solver's accuracy.
        judge_copies_solver: share of debates whose judge's answer is the solver's last answer
            (same normal form; ``None`` in ``single`` mode).
        wrong_to_right: debates whose first answer was wrong and final answer right, over all debates.
        right_to_wrong: debates whose first answer was right and final answer wrong, over all debates.
        missing_verdict_share, net_repair_rate, repair_when_rejected, repair_when_accepted: as
            :class:`~trainer_client.credit.verdicts.VerdictFigures` (``None`` in ``single`` mode
            or where nothing was counted); the verdict accuracies above come from the same records.
        episode_rewards: per debate, ``G`` (problem ``i``'s debates at ``i*k .. i*k + k - 1``).
        first_answer_correct: per debate, whether the solver's first answer was right.
        seconds: wall-clock of the evaluation.
        mean_tokens: generated tokens of a debate (every turn the model played), mean over
            debates: the inference cost a majority vote is compared at.
    """

    n: int
    episode_reward: float
    finished_rate: float
    judge_accuracy: float | None
    episode_rewards: list[float]
    first_answer_correct: list[bool]
    seconds: float
    k: int = 1
    temperature: float | None = None
    first_answer_accuracy: float = 0.0
    verdict_accuracy_right: float | None = None
    verdict_accuracy_wrong: float | None = None
    balanced_verdict_accuracy: float | None = None
    judge_copies_solver: float | None = None
    wrong_to_right: float = 0.0
    right_to_wrong: float = 0.0
    missing_verdict_share: float | None = None
    net_repair_rate: float | None = None
    repair_when_rejected: float | None = None
    repair_when_accepted: float | None = None
    mean_tokens: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The aggregates without the per-debate lists."""
        return {k: v for k, v in asdict(self).items() if k not in ("episode_rewards", "first_answer_correct")}

    def per_problem_final(self) -> list[float]:
        """``(n,)`` each problem's final accuracy (mean ``G`` over its ``k`` debates)."""
        return [sum(self.episode_rewards[i * self.k:(i + 1) * self.k]) / self.k for i in range(self.n)]


def evaluate_episodes(model: Any, tokenizer: Any, source: ProblemSource, seeds: Sequence[int], *,
                      max_rounds: int = 1, batch_size: int = 64, max_new_tokens: int = 96,
                      mode: str = "debate", play_as: Callable[[Any], AbstractContextManager[Any]] | None = None,
                      k: int = 0, temperature: float = 1.0, sample_seed: int = 0,
                      transcripts: list[dict[str, Any]] | None = None) -> EpisodeReport:
    """Whole episodes on ``source.by_seed(s)``, greedy (``k == 0``) or ``k`` sampled per problem at
    ``temperature``: the model plays every role, turn by turn, in the token layout of TRL's tool
    loop (its own tokens, then the tool-result suffix of the training chat template), against the
    server's own :class:`~env_server.debate.episode.DebateEpisode`; answers graded with
    :func:`grade_answer_text` and ``G`` computed by the server's rewards rule.

    A turn that is not a valid call of the acting role's tool ends the rollout: its text becomes
    the acting role's action and the remaining turns are forfeited, as the training adapter
    finishes an episode (stricter than TRL's loop, which answers a wrong tool with an error and
    lets the model try again in the same rollout).

    Args:
        model, tokenizer: a Hugging Face causal LM and its tokenizer (chat template with tools).
        source, seeds: the problems (held-out: :func:`heldout_seeds`).
        max_rounds: solver/verifier rounds before the judge.
        batch_size: debates per generation batch (left padding).
        max_new_tokens: longest generated turn.
        mode: ``debate``, or ``single`` (the solver's one answer, RFC 0006; no judge, so
            ``judge_accuracy`` is ``None``).
        play_as: per-role policies: ``play_as(role)`` makes ``role``'s policy the model's while
            that role's turns are generated (one generation call per role present each turn);
            ``None``: one policy plays every role.
        k: sampled debates per problem (every turn sampled at ``temperature``, ``top_k`` 0,
            ``top_p`` 1); 0: one greedy debate per problem.
        transcripts: when given, one dict per debate is appended to it: ``problem_id``,
            ``problem``, ``gold``, ``turns`` (per turn ``t``, ``role``, the model's ``generated``
            text, whether it was a ``valid_call`` of the role's tool, the submitted ``content``,
            the parsed ``verdict`` and ``answer``) and the graded ``record`` (JSON); for audits
            (``scripts/verifier_audit.py``).
        temperature: the sampling temperature (unused when greedy).
        sample_seed: torch seed of the samples (reproducible; the global generator is restored).

    Returns:
        :class:`EpisodeReport` over the ``len(seeds) * max(k, 1)`` debates.
    """
    import torch

    from env_server.debate.answers import answer_key
    from env_server.debate.episode import DebateEpisode
    from env_server.debate.rewards import episode_rewards_data
    from env_server.protocol.grades import Grade
    from env_server.protocol.markers import EpisodeMode, ErrorKind, Role
    from env_server.protocol.models import DebateAction, DebateObservation, EpisodeRewards
    from trainer_client.credit.verdicts import verdict_figures
    from trainer_client.rollout.chat_template import training_chat_template
    from trainer_client.rollout.tool_calls import tool_callables
    from trainer_client.rollout.tools import FORFEIT_ACTION

    start = time.perf_counter()
    was_training = model.training
    model.train(False)
    tools = tool_callables()
    template = training_chat_template(tokenizer)
    per_problem = max(k, 1)
    sample = k > 0
    rewards: list[float] = []
    first_correct: list[bool] = []
    finished = judge_right = judge_copies = 0
    wrong_to_right = right_to_wrong = 0
    records: list[EpisodeRewards] = []
    problems = [source.by_seed(s) for s in seeds for _ in range(per_problem)]
    generated_tokens = 0

    def observation(episode: DebateEpisode) -> DebateObservation:
        return DebateObservation.model_validate(json.loads(episode.last_observation)["observation"])

    generator_state = torch.random.get_rng_state()
    torch.manual_seed(sample_seed)
    try:
        for i in range(0, len(problems), batch_size):
            batch = problems[i:i + batch_size]
            episodes = [DebateEpisode(f"heldout-{i + j}", p, max_rounds=max_rounds, max_action_chars=4096,
                                      mode=EpisodeMode(mode)) for j, p in enumerate(batch)]
            contexts = [solver_prompt_ids(tokenizer, p, tools, max_rounds, mode) for p in batch]
            forfeited = [False] * len(batch)
            generated: list[dict[int, tuple[str, bool]]] = [{} for _ in batch]
            while active := [j for j, e in enumerate(episodes) if not e.done]:
                texts: list[list[str]] = [[] for _ in active]
                by_role = {None: list(range(len(active)))} if play_as is None else {
                    role: [p for p, j in enumerate(active) if episodes[j].role is role]
                    for role in dict.fromkeys(episodes[j].role for j in active)}
                for role, positions in by_role.items():
                    with nullcontext() if play_as is None else play_as(role):
                        counts: list[int] = []
                        made = generate_turns(model, tokenizer, [contexts[active[p]] for p in positions], sample=sample,
                                              num=1, temperature=temperature, max_new_tokens=max_new_tokens,
                                              token_counts=counts)
                        generated_tokens += sum(counts)
                    for p, turn_texts in zip(positions, made, strict=True):
                        texts[p] = turn_texts
                for j, (text,) in zip(active, texts, strict=True):
                    episode = episodes[j]
                    role = episode.role
                    assert role is not None, "an episode that is not done has a role to play"
                    content = role_tool_action(text, role)
                    generated[j][len(episode.turns)] = (text, content is not None)
                    if content is not None:
                        episode.step(DebateAction(role=role, content=content))
                        contexts[j] = extend_context(tokenizer, contexts[j], text,
                                                     None if episode.done else observation(episode), role, template)
                        continue
                    fallback = own_text(text).strip()[:4096]
                    episode.step(DebateAction(role=role, content=fallback or FORFEIT_ACTION))
                    forfeited[j] = not fallback
                    while not episode.done:
                        assert episode.role is not None
                        episode.step(DebateAction(role=episode.role, content=FORFEIT_ACTION))
                        forfeited[j] = True
            for episode, was_forfeited, texts_by_t in zip(episodes, forfeited, generated, strict=True):
                grades = {}
                for turn in episode.turns:
                    if turn.needs_grade:
                        correct = grade_answer_text(episode.problem.answer, turn.answer)
                        kind = ErrorKind.MISSING_FINAL_ANSWER if turn.answer is None else None
                        grades[turn.t] = Grade(correct, kind, "heldout")
                record = episode_rewards_data(episode, grades, graded_at=0.0)
                records.append(EpisodeRewards.model_validate(record))
                if transcripts is not None:
                    transcripts.append({
                        "problem_id": episode.problem.problem_id, "problem": episode.problem.problem,
                        "gold": episode.problem.answer, "record": records[-1].model_dump(mode="json"),
                        "turns": [{"t": turn.t, "role": turn.role.value,
                                   "generated": texts_by_t.get(turn.t, (None, False))[0],
                                   "valid_call": texts_by_t.get(turn.t, (None, False))[1],
                                   "content": turn.content, "verdict": turn.verdict, "answer": turn.answer}
                                  for turn in episode.turns]})
                reward, first = float(record["episode_reward"]), bool(record["facts"]["first_answer_correct"])
                rewards.append(reward)
                first_correct.append(first)
                wrong_to_right += (not first) and reward == 1.0
                right_to_wrong += first and reward == 0.0
                finished += not was_forfeited
                judge_right += bool(record["facts"]["judge_correct"])
                solver_answers = [t.answer for t in episode.turns if t.role is Role.SOLVER]
                judge_answer = episode.turns[-1].answer if episode.turns[-1].role is Role.JUDGE else None
                judge_copies += (judge_answer is not None and bool(solver_answers) and solver_answers[-1] is not None
                                 and answer_key(judge_answer) == answer_key(solver_answers[-1]))
    finally:
        torch.random.set_rng_state(generator_state)
        model.train(was_training)
    n = len(rewards)
    debate = mode == "debate"
    verdicts = verdict_figures(records) if debate else None
    return EpisodeReport(n=len(seeds), episode_reward=sum(rewards) / n if n else 0.0,
                         finished_rate=finished / n if n else 0.0,
                         judge_accuracy=(judge_right / n if n else 0.0) if debate else None,
                         episode_rewards=rewards, first_answer_correct=first_correct,
                         seconds=time.perf_counter() - start, k=per_problem, temperature=temperature if sample else None,
                         first_answer_accuracy=sum(first_correct) / n if n else 0.0,
                         verdict_accuracy_right=verdicts.verdict_accuracy_right if verdicts else None,
                         verdict_accuracy_wrong=verdicts.verdict_accuracy_wrong if verdicts else None,
                         balanced_verdict_accuracy=verdicts.balanced_verdict_accuracy if verdicts else None,
                         missing_verdict_share=verdicts.missing_verdict_share if verdicts else None,
                         net_repair_rate=verdicts.net_repair_rate if verdicts else None,
                         repair_when_rejected=verdicts.repair_when_rejected if verdicts else None,
                         repair_when_accepted=verdicts.repair_when_accepted if verdicts else None,
                         judge_copies_solver=(judge_copies / n if n else 0.0) if debate else None,
                         wrong_to_right=wrong_to_right / n if n else 0.0, right_to_wrong=right_to_wrong / n if n else 0.0,
                         mean_tokens=generated_tokens / n if n else 0.0)
