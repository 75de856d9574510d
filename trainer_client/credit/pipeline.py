"""The reward pipeline: from the graded record the client receives to TRL's ``(B, T)``
advantages and loss mask, top to bottom, in one module.

This module is the only code that writes the advantages or the loss mask into TRL's batch
(:func:`write_advantages`, :func:`write_loss_mask`), but for step 10 of ``grpo_state``
(``state_groups.write_state_credit``); ``tests/trainer_client/credit/test_pipeline.py`` checks that
no other module assigns them. The trainer's TRL hook (``DebateGRPOTrainer.on_scored_batch``)
calls it in this order and only gathers across processes in between:

1. **user reward function** (:func:`user_rewards`, applied by :func:`rescored_records`): where
   ``reward_function.use_score``, a valid score replaces the episode reward ``G`` of its rollout.
2. **unfinished debates** (:func:`score_unfinished_debates`): a rollout whose debate the
   adapter had to finish by forfeiting turns gets ``unfinished_debate_reward`` as ``G``.
3. *(the trainer gathers the records of every process)*
4. **failed rollouts** (:func:`drop_failed_rollouts`, issue 45, ``docs/failures.md``): a
   rollout whose episode failed (a model request failed for good) leaves its group (a group id
   of its own), so every group is normalised over the rest; a group a failure left with fewer
   than two scored rollouts gives nothing; their tokens leave the loss at step 8.
   **shuffled control** (:func:`shuffle_episode_rewards`; control runs only): ``G`` permuted
   across the gathered batch's scored rollouts.
5. **role samples** (``role_samples.build_role_samples``): every rollout's record becomes one
   sample per role that acted; rollouts of one prompt share a group id.
6. **shaping** (``role_samples.shape_samples``): the configured strategy (``credit/shaping/``)
   turns each sample's ``G`` into a shaped reward (a strategy that raises gives the raw
   rewards for the batch).
7. **advantage estimator**: ``grpo`` normalises per (group, role) with TRL's convention
   (``group_norm.group_normalize`` over ``role_samples.role_group_keys``, then
   ``role_samples.turn_values``); ``grpo_turn`` per (group, role, that role's k-th turn)
   (``role_samples.turn_group_values``); ``gigpo`` adds a step-level advantage over anchor
   states (``gigpo.gigpo_turn_values``; its step inputs come from ``step_credit.gigpo_steps``).
   Either way each debate turn gets one advantage; judge turns get 0. With
   ``verdict_balance: batch`` each verifier turn's advantage is then weighted by the inverse
   frequency of its reviewed answer's class (``verdict_balance.balance_verdict_credit``).
8. **tokens** (:func:`token_tensors`): each turn's advantage is spread over the tokens of the
   assistant message that produced it (its completion segment); tokens of no trained turn
   (judge, tool output, after the debate) and of dropped rollouts are masked out.
9. **TRL's batch**: the advantages replace TRL's (:func:`write_advantages`); the loss channels
   prepare; then the loss mask is TRL's (``tool_mask``) × step 8's × the role router's
   (untrained roles' tokens) × each loss channel's route (tokens a channel takes away from the
   GRPO term), and ``num_items_in_batch`` counts what is left (:func:`write_loss_mask`).
10. **state groups** (``grpo_state`` only, ``state_groups.state_credit``): the actions sampled
   from one state get AT-GRPO's within-state advantages: the continued one on its rollout's turn,
   the others as rows appended to the batch.

The data forms on the way (six): the graded ``EpisodeRewards`` records, each rollout's
completion ``Segment`` list, the ``RoleSamples`` (one per rollout and role), the ``(N,)``
shaped rewards, the per-turn values (one array per rollout) and the ``(B, T)`` tensors
(:class:`BatchAdvantages`). The modules (four): this one, ``role_samples`` (samples, shaping,
per-turn values), ``group_norm`` (every group statistic) and, for ``gigpo``, ``gigpo``.

TRL also computes rewards and advantages of its own, from the environment's ``get_reward()``
(TRL needs a reward source; its ``rewards/DebateEnvironment/*`` logs come from it): step 9
replaces those advantages before TRL's loss reads them.

Steps 1-2 run on this process's ``B`` rollouts (:func:`rescored_records`), steps 4-8 on the
gathered batch (:func:`batch_advantages`), step 9 on this process's batch. Shapes: ``B``
rollouts on this process, ``N`` role samples on all processes, ``T`` completion tokens.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.fidelity import credit_fidelity
from trainer_client.credit.gigpo import GiGPOInputs, gigpo_turn_values
from trainer_client.credit.group_norm import GRPO_EPS, group_normalize
from trainer_client.credit.role_samples import (
    RoleSamples,
    build_role_samples,
    role_group_keys,
    shape_samples,
    turn_group_values,
    turn_values,
)
from trainer_client.credit.shaping import RewardShapingStrategy
from trainer_client.credit.verdict_balance import VERDICT_BALANCES, balance_verdict_credit
from trainer_client.rollout.segments import Segment, owned_segments
from trainer_client.trl_compat import LOSS_MASK_KEY

if TYPE_CHECKING:
    import torch

__all__ = ["ESTIMATORS", "MIN_SCORED_PER_GROUP", "BatchAdvantages", "DroppedRollouts", "Estimator", "batch_advantages",
           "drop_failed_rollouts", "rescored_records", "score_unfinished_debates", "shuffle_episode_rewards",
           "token_tensors", "trl_loss_mask", "user_rewards", "write_advantages", "write_loss_mask"]

log = logging.getLogger(__name__)

Estimator = Literal["grpo", "grpo_turn", "gigpo", "grpo_state"]
#: The advantage estimators of step 7 (``grpo_state`` is ``grpo`` here; its state groups come after
#: step 9, :mod:`trainer_client.credit.state_groups`).
ESTIMATORS: tuple[str, ...] = ("grpo", "grpo_turn", "gigpo", "grpo_state")


# --------------------------------------------------------------------------- steps 1-2 (this process)

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


# --------------------------------------------------------------------------- step 4 (gathered batch)

#: The fewest scored rollouts a group needs to give an advantage (a baseline needs two).
MIN_SCORED_PER_GROUP = 2


@dataclass(frozen=True)
class DroppedRollouts:
    """The result of :func:`drop_failed_rollouts`, per rollout of the gathered batch.

    Attributes:
        group_ids: each rollout's group id; a dropped rollout's is ``-1 - k``, a group of its own.
        dropped: whether rollout ``k`` leaves the loss (failed, or in a group that gave nothing).
        failed: whether rollout ``k`` failed (the input flags).
    """

    group_ids: tuple[int, ...]
    dropped: tuple[bool, ...]
    failed: tuple[bool, ...]

    @property
    def metrics(self) -> dict[str, float]:
        """``rollouts/failed`` and ``rollouts/dropped``: counts in the gathered batch."""
        return {"rollouts/failed": float(sum(self.failed)), "rollouts/dropped": float(sum(self.dropped))}


def drop_failed_rollouts(group_ids: Sequence[int], failed: Sequence[bool],
                         min_scored: int = MIN_SCORED_PER_GROUP) -> DroppedRollouts:
    """Take failed rollouts out of their groups (step 4 of the module docstring).

    Args:
        group_ids: ``n`` group ids, one per rollout of the gathered batch (non-negative:
            rollouts of one prompt share one).
        failed: ``n`` flags, ``True`` where the rollout's episode failed.
        min_scored: the fewest scored rollouts a group needs to stay.

    Returns:
        :class:`DroppedRollouts`.

    Raises:
        ValueError: the lengths differ, or a group id is negative (the dropped rollouts' range).
    """
    if len(group_ids) != len(failed):
        raise ValueError(f"{len(group_ids)} group ids for {len(failed)} failure flags")
    if any(gid < 0 for gid in group_ids):
        raise ValueError("group ids must be non-negative: negative ids mark dropped rollouts")
    scored = Counter(gid for gid, bad in zip(group_ids, failed, strict=True) if not bad)
    hit = {gid for gid, bad in zip(group_ids, failed, strict=True) if bad}
    dropped = tuple(bool(bad) or (gid in hit and scored[gid] < min_scored)
                    for gid, bad in zip(group_ids, failed, strict=True))
    ids = tuple(-1 - k if drop else int(gid) for k, (gid, drop) in enumerate(zip(group_ids, dropped, strict=True)))
    return DroppedRollouts(ids, dropped, tuple(bool(bad) for bad in failed))


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


# --------------------------------------------------------------------------- steps 4-8 (gathered batch)


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
    estimator: Estimator = "grpo",
    gigpo: GiGPOInputs | None = None,
    shuffle_seed: int | None = None,
    failed: Sequence[bool] | None = None,
    verdict_balance: str = "none",
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
        estimator: step 7's estimator: ``"grpo"`` (per (group, role)), ``"grpo_turn"`` (per
            (group, role, that role's k-th turn): ``role_samples.turn_group_values``) or
            ``"gigpo"`` (needs ``gigpo``).
        gigpo: GiGPO's inputs (``estimator="gigpo"`` only).
        shuffle_seed: the shuffled-reward control's seed (step 4; the same on every process);
            ``None``: no shuffling.
        failed: per rollout of ``all_records``, whether its episode failed (step 4; ``None``:
            none did).
        verdict_balance: ``"batch"``: each verifier turn's advantage weighted by the inverse
            frequency of its reviewed answer's class in the batch (step 7, after the estimator:
            :mod:`trainer_client.credit.verdict_balance`); ``"none"``: not.

    Returns:
        :class:`BatchAdvantages` with ``B = len(segments)``.

    Raises:
        ValueError: a record is missing, lengths disagree, an unknown estimator, or ``gigpo``
            given for another estimator than ``"gigpo"`` (or missing for it), or an unknown
            ``verdict_balance``.
    """
    if verdict_balance not in VERDICT_BALANCES:
        raise ValueError(f"verdict_balance must be one of {', '.join(VERDICT_BALANCES)}, got {verdict_balance!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if (estimator == "gigpo") != (gigpo is not None):
        raise ValueError("the gigpo estimator needs its inputs (gigpo=...), and only it takes them")
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
    if gigpo is not None:  # estimator == "gigpo"
        per_turn_all, gigpo_metrics = gigpo_turn_values(
            samples, shaped, gigpo.step_rewards, gigpo.observations, group_ids, omega=gigpo.omega, gamma=gigpo.gamma,
            mode=gigpo.mode, similarity_threshold=gigpo.similarity_threshold)
        metrics.update(gigpo_metrics)
    elif estimator == "grpo_turn":
        per_turn_all = turn_group_values(samples, shaped, scale=scale)
    else:
        sample_advantages = group_normalize(shaped, role_group_keys(samples.roles, samples.group_ids), scale=scale,
                                            eps=GRPO_EPS, singleton="zero").astype(shaped.dtype)
        per_turn_all = turn_values(samples, sample_advantages)
    if verdict_balance == "batch":  # RL Tango's inverse class frequency on the verifier's turns
        per_turn_all, balance_metrics = balance_verdict_credit(all_records, per_turn_all, dropped)
        metrics.update(balance_metrics)
    kept_rows = [k for k, out in enumerate(dropped) if not out]  # a dropped rollout has no credit to judge
    metrics.update(credit_fidelity([all_records[k] for k in kept_rows], [per_turn_all[k] for k in kept_rows]))
    per_turn = per_turn_all[first_rollout:first_rollout + len(segments)]
    # 8. tokens
    owned = [owned_segments(segs) if segs is not None and not dropped[first_rollout + k] else []
             for k, segs in enumerate(segments)]
    advantages, loss_mask = token_tensors(owned, per_turn, completion_length)
    return BatchAdvantages(advantages, loss_mask, samples, shaped, metrics, tuple(dropped))


def token_tensors(
    segments: Sequence[Sequence[Segment]],
    per_turn_values: Sequence[Sequence[float] | np.ndarray],
    T: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spread per-turn values over their tokens.

    Args:
        segments: per rollout (row), the completion segments of its turns (each with an owner).
        per_turn_values: per rollout, the value of each turn ``t`` (see :func:`turn_values`).
        T: completion length (padded), tokens.

    Returns:
        ``values``: ``(B, T)`` float32 CPU tensor, a segment's turn value on its tokens, 0 elsewhere.
        ``loss_mask``: ``(B, T)`` bool CPU tensor, True on the tokens of non-judge segments only:
        False on judge tokens, padding and tokens outside every segment.

    Raises:
        ValueError: the row counts differ, a segment ends past ``T``, segments overlap, or a
            segment's turn has no value.
    """
    import torch

    if len(segments) != len(per_turn_values):
        raise ValueError(f"{len(segments)} segment rows for {len(per_turn_values)} value rows")
    values = np.zeros((len(segments), T), dtype=np.float32)
    mask = np.zeros((len(segments), T), dtype=bool)
    for k, (row, turn_vals) in enumerate(zip(segments, per_turn_values, strict=True)):
        covered = np.zeros(T, dtype=bool)
        for segment in row:
            if segment.end > T:
                raise ValueError(f"row {k}: segment {segment} ends past T={T}")
            if segment.turn >= len(turn_vals):
                raise ValueError(f"row {k}: segment {segment} refers to a turn with no value")
            if covered[segment.start:segment.end].any():
                raise ValueError(f"row {k}: segment {segment} overlaps another segment")
            covered[segment.start:segment.end] = True
            if segment.role is not Role.JUDGE:
                values[k, segment.start:segment.end] = turn_vals[segment.turn]
                mask[k, segment.start:segment.end] = True
    return torch.from_numpy(values), torch.from_numpy(mask)


# --------------------------------------------------------------------------- step 9 (TRL's batch)

def trl_loss_mask(output: dict[str, Any]) -> torch.Tensor:
    """TRL's own per-token loss mask of a scored batch, read only: ``output[LOSS_MASK_KEY]`` (0 on
    tool-result tokens), or ones like ``completion_mask`` where TRL left none. ``(B, T)`` int."""
    mask = output.get(LOSS_MASK_KEY)
    if mask is None:
        import torch

        mask = torch.ones_like(output["completion_mask"])
    return mask


def write_advantages(output: dict[str, Any], result: BatchAdvantages) -> None:
    """Step 9, first half: ``output["advantages"]`` becomes ``result.advantages`` (``(B, T)``
    float32 on the batch's device), replacing TRL's own (from ``get_reward()``) before the loss
    channels read the batch.

    Raises:
        ValueError: the advantages are not ``(B, T)`` like ``output["completion_mask"]``.
    """
    completion_mask = output["completion_mask"]
    _check_shape("advantages", result.advantages, completion_mask)
    output["advantages"] = result.advantages.to(completion_mask.device)


def write_loss_mask(output: dict[str, Any], result: BatchAdvantages, routes: Sequence[torch.Tensor],
                    gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Step 9, second half, once the loss channels have said which tokens they take: the loss
    mask (``output[LOSS_MASK_KEY]``, trl 1.16's ``tool_mask``: 0 on tool-result tokens, ones
    where TRL left none) is multiplied by ``result.loss_mask`` and by every tensor of
    ``routes``, and ``output["num_items_in_batch"]`` becomes the number of completion tokens left
    in the loss over all processes.

    Args:
        output: TRL's batch (trl 1.16 ``_generate_and_score_completions``' output), with
            ``completion_mask`` ``(B, T)`` int.
        result: :func:`batch_advantages`' result for this process's ``B`` rows.
        routes: further ``(B, T)`` 0/1 masks: the role router's (tokens of untrained roles) and
            each loss channel's (tokens it takes away from the GRPO term).
        gather: gathers a tensor from every process (``accelerator.gather``; the identity on one).

    Raises:
        ValueError: a mask is not ``(B, T)``.
    """
    completion_mask = output["completion_mask"]
    for name, tensor in (("loss mask", result.loss_mask), *(("route", route) for route in routes)):
        _check_shape(name, tensor, completion_mask)
    device, trl_mask = completion_mask.device, trl_loss_mask(output)
    loss_mask = trl_mask * result.loss_mask.to(device=device, dtype=trl_mask.dtype)
    for route in routes:
        loss_mask = loss_mask * route.to(device=device, dtype=loss_mask.dtype)
    output[LOSS_MASK_KEY] = loss_mask
    output["num_items_in_batch"] = gather((completion_mask * loss_mask).sum()).sum()


def _check_shape(name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    if tuple(tensor.shape) != tuple(like.shape):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, the batch {tuple(like.shape)}")
