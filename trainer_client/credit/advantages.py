"""From graded records to the loss's ``(B, T)`` advantages and loss mask, in one place.

Every rewrite of an episode reward between the server's record and the loss happens here, as
one numbered step, top to bottom (CleanRL style; the trainer only gathers across processes
and writes the outputs into TRL's batch):

1. **user reward function** (:func:`user_rewards`): where ``reward_function.use_score``, a
   valid score replaces the episode reward ``G`` of its rollout.
2. **unfinished debates** (:func:`score_unfinished_debates`): a rollout whose debate the
   adapter had to finish by forfeiting turns gets ``unfinished_debate_reward`` as ``G``.
3. *(the trainer gathers the records of every process)*
4. **failed rollouts** (:func:`~trainer_client.credit.failed_rollouts.drop_failed_rollouts`):
   a rollout whose episode failed (a model request failed for good, issue 45) leaves its group
   (a group id of its own), so every group is normalised over the rest; a group a failure left
   with fewer than two scored rollouts gives nothing; their tokens leave the loss at step 8.
   **shuffled control** (:func:`shuffle_episode_rewards`; control runs only): ``G`` permuted
   across the gathered batch's scored rollouts.
5. **role samples**: every rollout's record becomes one sample per role that acted
   (``role_samples.build_role_samples``); rollouts of one prompt share a group id.
6. **shaping**: the configured strategy turns each sample's ``G`` into a shaped reward
   (``role_samples.shape_samples``; a strategy that raises gives the raw rewards for the batch).
7. **advantage estimator**: ``grpo`` normalises per (group, role) with TRL's convention
   (``group_norm.group_normalize`` over ``role_samples.role_group_keys``); ``grpo_turn`` per
   (group, role, that role's k-th turn) (``turn_groups.turn_group_values``); ``gigpo`` adds
   a step-level advantage over anchor states (``step_credit.gigpo_turn_values``; its step
   inputs from :func:`gigpo_steps`). Either way each debate turn gets one advantage; judge
   turns get 0.
8. **tokens**: each turn's advantage is spread over the tokens of the assistant message that
   produced it (``spans.role_spans``, ``role_samples.token_tensors``); tokens of no trained
   turn (judge, tool output, after the debate) and of dropped rollouts are masked out of the loss.

Steps 1-2 run on this process's ``B`` rollouts (:func:`rescored_records`), steps 4-8 on the
gathered batch (:func:`batch_advantages`). Shapes: ``B`` rollouts on this process, ``N`` role
samples on all processes, ``T`` completion tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.failed_rollouts import drop_failed_rollouts
from trainer_client.credit.fidelity import credit_fidelity
from trainer_client.credit.gigpo import NormMode
from trainer_client.credit.group_norm import GRPO_EPS, group_normalize
from trainer_client.credit.role_samples import (
    RoleSamples,
    build_role_samples,
    role_group_keys,
    shape_samples,
    token_tensors,
    turn_values,
)
from trainer_client.credit.shaping import RewardShapingStrategy
from trainer_client.credit.step_credit import gigpo_turn_values, rollout_steps, step_rewards
from trainer_client.credit.turn_groups import turn_group_values
from trainer_client.rollout.spans import Segment, role_spans

__all__ = ["BatchAdvantages", "GiGPOInputs", "batch_advantages", "gigpo_steps", "rescored_records", "score_unfinished_debates",
           "shuffle_episode_rewards", "user_rewards"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GiGPOInputs:
    """What GiGPO needs beyond the records, per rollout of the gathered batch.

    Attributes:
        step_rewards: ``r_t`` per turn (Eq. 5), one list per rollout.
        observations: the acting role's observation per turn (Eq. 6 anchor states).
        omega, gamma, mode, similarity_threshold: see ``config.GiGPOConfig``.
    """

    step_rewards: Sequence[Sequence[float]]
    observations: Sequence[Sequence[str | None]]
    omega: float
    gamma: float
    mode: NormMode = "mean_norm"
    similarity_threshold: float | None = None


@dataclass(frozen=True)
class BatchAdvantages:
    """The result for this process's rollouts.

    Attributes:
        advantages: ``(B, T)`` float32 per-token advantages.
        loss_mask: ``(B, T)`` bool, True on tokens of a trained turn (False on judge tokens,
            tool output, padding and tokens after the debate).
        samples: the gathered batch's role samples (for metrics).
        shaped: ``(N,)`` shaped reward per role sample.
        metrics: estimator metrics (e.g. ``gigpo/anchor_fraction``), each role's credit
            fidelity and signal (:func:`~trainer_client.credit.fidelity.credit_fidelity`), and
            with failure flags ``rollouts/failed`` and ``rollouts/dropped``.
        dropped: per rollout of the gathered batch, whether it left the loss (failed, or in a
            group a failure left too small); all ``False`` without failure flags.
    """

    advantages: torch.Tensor
    loss_mask: torch.Tensor
    samples: RoleSamples
    shaped: np.ndarray
    metrics: dict[str, float] = field(default_factory=dict)
    dropped: tuple[bool, ...] = ()


def shuffle_episode_rewards(records: Sequence[EpisodeRewards], seed: int) -> list[EpisodeRewards]:
    """The shuffled-reward control: the same records with their episode rewards ``G`` permuted
    across the batch (``numpy.random.default_rng(seed).permutation``).

    The batch keeps its reward distribution (same mean, same number of correct rollouts) but a
    rollout's advantage no longer depends on its own outcome, so a policy trained on it should not
    improve beyond what the reward-free parts of the update (e.g. entropy changes) do. Only ``G``
    moves: per-turn rewards and counterfactual facts stay as graded, so use it with identity
    shaping (which reads only ``G``).

    Args:
        records: the gathered batch's graded records, ``n`` long.
        seed: the permutation's seed; every process must pass the same one.

    Returns:
        ``n`` records; record ``k`` carries ``records[perm[k]].episode_reward``.
    """
    perm = np.random.default_rng(seed).permutation(len(records))
    return [rec.model_copy(update={"episode_reward": records[int(j)].episode_reward})
            for rec, j in zip(records, perm, strict=True)]


def score_unfinished_debates(records: Sequence[EpisodeRewards], unfinished: Sequence[bool],
                             reward: float | None) -> list[EpisodeRewards]:
    """Give every unfinished debate the episode reward ``reward``.

    A debate is unfinished when the rollout did not play all its turns: it stopped calling tools
    (its last text was submitted for the acting role) or ran out of completion length, and the
    environment adapter forfeited the remaining turns. The server's rule (the judge's answer, else
    the solver's last one) would grade such a debate on the solver's answer alone, so skipping the
    verifier and the judge costs nothing; on the tiny model at lr 3e-4 the policy learned exactly
    that (tool calls per rollout 2.9 -> 0.6 in 200 steps), and its greedy answers stopped being
    tool calls. Scoring unfinished debates as lost is the format reward of GRPO recipes
    (DeepSeek-R1, Guo et al. 2025, section 2.2.2) applied to the whole debate.

    Only ``G`` changes; per-turn rewards and facts stay as graded (forfeited turns already earn 0).

    Args:
        records: ``n`` graded records.
        unfinished: ``n`` flags, ``True`` where the adapter forfeited a turn of that rollout.
        reward: the episode reward of an unfinished debate; ``None`` keeps the graded one.

    Returns:
        ``n`` records (the same objects where nothing changes).

    Raises:
        ValueError: the lengths differ.
    """
    if len(records) != len(unfinished):
        raise ValueError(f"{len(records)} records for {len(unfinished)} unfinished flags")
    if reward is None:
        return list(records)
    return [rec.model_copy(update={"episode_reward": float(reward)}) if flag else rec
            for rec, flag in zip(records, unfinished, strict=True)]


def batch_advantages(
    all_records: Sequence[EpisodeRewards],
    num_generations: int,
    strategy: RewardShapingStrategy,
    segments: Sequence[Sequence[Segment] | None],
    completion_length: int,
    first_rollout: int,
    *,
    scale: bool = True,
    verifier_accept_probs: Sequence[float | None] | None = None,
    gigpo: GiGPOInputs | None = None,
    shuffle_seed: int | None = None,
    by_turn: bool = False,
    failed: Sequence[bool] | None = None,
) -> BatchAdvantages:
    """Advantages and loss mask of this process's rollouts (steps 4-8 of the module docstring).

    Args:
        all_records: the graded record of every rollout on every process, in batch order
            (groups contiguous, ``num_generations`` long, as TRL lays them out).
        num_generations: rollouts per prompt.
        strategy: the reward-shaping strategy.
        segments: per local rollout, its completion segments (``None``: unmatched, left out of
            the loss).
        completion_length: ``T``.
        first_rollout: index in ``all_records`` of this process's first rollout.
        scale: divide by the group std (``grpo`` only).
        verifier_accept_probs: per rollout of ``all_records``, π(CORRECT) at its first verdict,
            for strategies that read ``verifier_accept_prob`` (COMA).
        gigpo: GiGPO's inputs; ``None`` selects the ``grpo`` estimator.
        shuffle_seed: the shuffled-reward control's seed (step 4; the same on every process);
            ``None``: no shuffling.
        by_turn: the ``grpo_turn`` estimator (groups by prompt, role and that role's k-th
            turn: :func:`~trainer_client.credit.turn_groups.turn_group_values`) instead of ``grpo``.
        failed: per rollout of ``all_records``, whether its episode failed (step 4; ``None``:
            none did).

    Returns:
        :class:`BatchAdvantages` with ``B = len(segments)``.

    Raises:
        ValueError: a record is missing, or lengths disagree.
    """
    group_ids = [i // num_generations for i in range(len(all_records))]
    metrics: dict[str, float] = {}
    # 4. failed rollouts leave their groups; then the shuffled-reward control, over the scored ones
    dropped = (False,) * len(all_records)
    if failed is not None:
        drop = drop_failed_rollouts(group_ids, failed)
        group_ids, dropped = list(drop.group_ids), drop.dropped
        metrics.update(drop.metrics)
    if shuffle_seed is not None:
        kept = [k for k, out in enumerate(dropped) if not out]
        shuffled = shuffle_episode_rewards([all_records[k] for k in kept], seed=shuffle_seed)
        all_records = list(all_records)
        for k, record in zip(kept, shuffled, strict=True):
            all_records[k] = record
    # 5. role samples: one per (rollout, role)
    samples = build_role_samples(all_records, group_ids)
    if verifier_accept_probs is not None:
        column = tuple(verifier_accept_probs[k] if role is Role.VERIFIER else None for k, role in samples.index)
        samples = replace(samples, batch=replace(samples.batch, verifier_accept_prob=column))
    # 6. shaping
    shaped = shape_samples(strategy, samples)
    # 7. one advantage per debate turn
    if gigpo is not None:
        per_turn_all, gigpo_metrics = gigpo_turn_values(
            samples, shaped, gigpo.step_rewards, gigpo.observations, group_ids, omega=gigpo.omega, gamma=gigpo.gamma,
            mode=gigpo.mode, similarity_threshold=gigpo.similarity_threshold)
        metrics.update(gigpo_metrics)
    elif by_turn:
        per_turn_all = turn_group_values(samples, shaped, scale=scale)
    else:
        sample_advantages = group_normalize(shaped, role_group_keys(samples.roles, samples.group_ids), scale=scale,
                                            eps=GRPO_EPS, singleton="zero").astype(shaped.dtype)
        per_turn_all = turn_values(samples, sample_advantages)
    kept_rows = [k for k, out in enumerate(dropped) if not out]  # a dropped rollout has no credit to judge
    metrics.update(credit_fidelity([all_records[k] for k in kept_rows], [per_turn_all[k] for k in kept_rows]))
    per_turn = per_turn_all[first_rollout:first_rollout + len(segments)]
    # 8. tokens
    spans = [role_spans(segs) if segs is not None and not dropped[first_rollout + k] else []
             for k, segs in enumerate(segments)]
    advantages, loss_mask = token_tensors(spans, per_turn, completion_length)
    return BatchAdvantages(advantages, loss_mask, samples, shaped, metrics, tuple(dropped))


def user_rewards(runner: Any, prompts: Sequence[Sequence[dict[str, Any]]], completions: Sequence[Sequence[dict[str, Any]]],
                 truths: Sequence[Any]) -> tuple[list[Any], dict[str, float]]:
    """Step 1's scores: the user reward function on every rollout's messages (prompt + completion).

    Args:
        runner: a :class:`~trainer_client.credit.reward_functions.RewardFunctionRunner`.
        prompts, completions: per rollout, its prompt and completion messages.
        truths: per rollout, the reference answer passed to the function (or ``None``).

    Returns:
        ``(results, metrics)``: one ``EvaluateResult`` per rollout, and the mean score and the
        share of invalid scores (``reward_function/score``, ``reward_function/invalid_fraction``).
    """
    messages = [list(prompt) + list(completion) for prompt, completion in zip(prompts, completions, strict=True)]
    results = runner.evaluate(messages, list(truths))
    invalid = [r.reason for r in results if not r.is_score_valid]
    if invalid:
        log.warning("%d/%d rollouts got an invalid user reward, e.g. %s", len(invalid), len(results), invalid[0])
    return results, {"reward_function/score": float(np.mean([r.score for r in results])),
                     "reward_function/invalid_fraction": float(np.mean([not r.is_score_valid for r in results]))}


def rescored_records(records: Sequence[EpisodeRewards], *, user_results: Sequence[Any] | None = None,
                    use_score: bool = True, unfinished: Sequence[bool] | None = None,
                    unfinished_reward: float | None = 0.0) -> list[EpisodeRewards]:
    """Steps 1 and 2 on this process's ``B`` records: the user's valid scores replace ``G``
    (when ``use_score``), then unfinished debates get ``unfinished_reward``.

    Args:
        records: ``B`` graded records.
        user_results: ``B`` results of the user reward function (``None``: none configured).
        use_score: whether a valid score replaces ``G``.
        unfinished: ``B`` flags, True where the adapter forfeited a turn (``None``: none).
        unfinished_reward: see :func:`score_unfinished_debates`.

    Returns:
        ``B`` records (the same objects where nothing changed).
    """
    out = list(records)
    if user_results is not None and use_score:
        out = [record.model_copy(update={"episode_reward": result.score}) if result.is_score_valid else record
               for record, result in zip(out, user_results, strict=True)]
    if unfinished is not None:
        out = score_unfinished_debates(out, unfinished, unfinished_reward)
    return out


def gigpo_steps(records: Sequence[EpisodeRewards], turn_logs: Sequence[Sequence[Any]],
                completions: Sequence[Sequence[dict[str, Any]] | None], user_results: Sequence[Any] | None,
                step_reward_default: float, gamma: float) -> tuple[list[tuple[list[float], list[str | None]]], int]:
    """GiGPO's step inputs for this process's rollouts (step 7, before gathering): per rollout
    ``r_t`` per turn (Eq. 5) and the acting role's observation per turn (Eq. 6's anchor states).

    Args:
        records: ``B`` graded records (after steps 1-2).
        turn_logs: ``B`` environment turn logs (``EpisodeTrace.turns``).
        completions: ``B`` completion message lists (they say which assistant message made each turn).
        user_results: ``B`` user reward results (their step outputs), or ``None``.
        step_reward_default: the reward of a step left without one.
        gamma: the step returns' discount.

    Returns:
        ``(steps, unaligned)``: per rollout ``(rewards, observations)``, and the number of user
        step outputs that could not be placed.
    """
    local, unaligned, unmatched = [], 0, []
    for k, (record, turns) in enumerate(zip(records, turn_logs, strict=True)):
        completion = completions[k] if k < len(completions) else None
        rollout = rollout_steps(record, turns, completion)
        result = user_results[k] if user_results is not None else None
        rewards, problems = step_rewards(record, rollout, result, step_reward_default, gamma=gamma)
        unaligned += len(problems)
        for problem in problems:
            log.debug("rollout %d: %s", k, problem)
        if rollout.unmatched is not None and problems:
            unmatched.append(rollout.unmatched)
        local.append((rewards, [s.observation_data for s in rollout.steps]))
    if unmatched:
        log.warning("%d/%d rollouts: step outputs ignored, no assistant message index could be placed (%s)",
                    len(unmatched), len(records), unmatched[0])
    return local, unaligned
