"""Advantages within a state: ``advantage_estimator: grpo_state`` (AT-GRPO's grouping).

AT-GRPO (arXiv 2510.11062, PettingLLMs) samples, at turn ``t`` of agent ``i``, ``K`` candidate
actions ``a^(1..K)`` from **one** state ``s_t`` and normalises their rewards within that group,
keyed by (problem, turn, agent), so that the candidates differ in the action alone, never in the
state they answer:

    A^(k) = r^(k) − mean_j r^(j)              (scale off)
    A^(k) = (r^(k) − mean_j r^(j)) / (std_j r^(j) + ε)   (scale on; Bessel std, ε = TRL's 1e-4)

and trains every candidate's tokens with its ``A^(k)``; one candidate continues the episode
(AT-GRPO continues with the best; here a setting: ``sampled``, the rollout's own sample, or ``best``).

Here a state group is one rollout's state at a turn of a branched role (the verifier's review,
the solver's revision), ``K`` actions sampled from that observation (the rollout's own and
``K − 1`` branches, each played on a fork of the session, RFC 0007); each action's reward
``r^(k)`` is the server's reward of that turn (``TurnReward.reward``: the verdict matches the
answer's correctness; the revision's answer is right), so nothing is graded in the trainer. A
branch the server could not grade (``None``) is in no group and gets 0. The team part of
AT-GRPO's reward (``α · r_team``) is not used: a branch's episode is not played to its end.

With ``verdict_balance: batch`` a verifier group's advantages are multiplied by its reviewed
answer's class weight ``w_c`` (:mod:`trainer_client.credit.verdict_balance`: every branch of a
group reviews the same answer). :func:`write_state_credit` puts the result into TRL's batch: the
continued action's advantage on the rollout's own turn, and every other action as a row of its
own (the rollout's prompt; its completion so far, out of the loss; the action, in the loss).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.group_norm import GRPO_EPS, group_normalize
from trainer_client.credit.verdict_balance import verdict_class_weights
from trainer_client.credit.verdicts import reviewed_verdicts
from trainer_client.rollout.branches import StateGroup
from trainer_client.rollout.segments import Segment
from trainer_client.trl_compat import LOSS_MASK_KEY

__all__ = ["balanced_state_advantages", "state_advantages", "state_metrics", "write_state_credit"]

#: TRL's batch columns that :func:`write_state_credit` extends (trl 1.16 ``_generate_and_score_completions``).
_EXTENDED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", LOSS_MASK_KEY, "advantages",
             "old_per_token_logps")

def state_advantages(groups: Sequence[StateGroup], *, scale: bool, eps: float = GRPO_EPS) -> list[np.ndarray]:
    """AT-GRPO's within-state advantages (module docstring), one ``(K,)`` float64 array per
    group; an ungraded branch gets 0 and is left out of its group's mean and std; a group with
    one graded branch gets 0 (no baseline)."""
    rewards = [b.reward if b.reward is not None else 0.0 for g in groups for b in g.branches]
    keys = [(i if b.reward is not None else None) for i, g in enumerate(groups) for b in g.branches]
    flat = group_normalize(rewards, keys, scale=scale, eps=eps) if rewards else np.zeros(0)
    out, at = [], 0
    for group in groups:
        out.append(flat[at:at + len(group.branches)])
        at += len(group.branches)
    return out


def state_metrics(groups: Sequence[StateGroup], advantages: Sequence[np.ndarray]) -> dict[str, float]:
    """Per batch: ``credit/state_groups`` (state groups), ``credit/state_groups_nonzero`` (share
    of them with a non-zero advantage: branches that were graded differently),
    ``credit/state_branch_reward`` (mean reward of the graded branches) and
    ``credit/state_branches_ungraded`` (branches the server did not grade)."""
    graded = [b.reward for g in groups for b in g.branches if b.reward is not None]
    nonzero = [bool(np.any(a != 0.0)) for a in advantages]
    return {"credit/state_groups": float(len(groups)),
            "credit/state_groups_nonzero": float(np.mean(nonzero)) if nonzero else 0.0,
            "credit/state_branch_reward": float(np.mean(graded)) if graded else 0.0,
            "credit/state_branches_ungraded": float(sum(b.reward is None for g in groups for b in g.branches))}


def balanced_state_advantages(groups: Sequence[StateGroup], advantages: Sequence[np.ndarray],
                              records: Sequence[EpisodeRewards]) -> list[np.ndarray]:
    """Each verifier group's advantages times the class weight of the answer it reviews, the
    weights of the rollouts' ``records`` (this process's batch, by row); other groups as given."""
    weights = verdict_class_weights(records)
    out = []
    for group, values in zip(groups, advantages, strict=True):
        right = {t: r for t, r, _ in reviewed_verdicts(records[group.row])}.get(group.t)
        out.append(values * weights[right] if group.role is Role.VERIFIER and right in weights else values)
    return out


def write_state_credit(output: dict[str, Any], groups: Sequence[StateGroup], advantages: Sequence[np.ndarray],
                       segments: Sequence[Sequence[Segment] | None], *, dropped: Sequence[bool],
                       logps: Callable[[dict[str, torch.Tensor]], torch.Tensor], gather: Callable[[torch.Tensor], torch.Tensor],
                       multiple_of: int, pad_token_id: int) -> int:
    """Write the state groups' credit into TRL's scored batch (after the pipeline's step 9).

    The continued action's advantage replaces, on the rollout's own tokens of that turn, what the
    estimator gave them; each other action becomes a row appended to every column of
    :data:`_EXTENDED`: the rollout's prompt, its completion so far (attended, out of the loss)
    and the action (in the loss, with its advantage). ``old_per_token_logps``, when TRL keeps
    it, is computed for the new rows by ``logps``. Empty rows (nothing in the loss) are added up
    to a multiple of ``multiple_of`` (TRL splits the batch into that many equal parts), and
    ``num_items_in_batch`` counts the new loss tokens over all processes.

    Args:
        output: TRL's batch; ``(B, P)`` prompts left-padded, ``(B, T)`` completions.
        groups, advantages: this process's state groups and their ``(K,)`` advantages.
        segments: per row, its completion segments (the continued turn's tokens).
        dropped: per row, whether the rollout left the batch (its groups are skipped).
        logps: ``{prompt_ids, prompt_mask, completion_ids, completion_mask} -> (N, T')`` per-token
            log-probs of the policy that sampled (no gradient).
        gather: sums across processes (``accelerator.gather``).
        multiple_of: TRL's ``steps_per_generation``.
        pad_token_id: the tokenizer's pad id.

    Returns:
        The number of rows appended (empty ones included).

    Raises:
        ValueError: a group's prompt is not its row's prompt, or the batch holds a per-row column
            this cannot extend (vLLM's importance ratios, reference log-probs, role routes).
    """
    rows = len(output["completion_ids"])
    unknown = [k for k, v in output.items() if isinstance(v, torch.Tensor) and v.dim() > 0 and len(v) == rows
               and k not in _EXTENDED]
    if unknown:
        raise ValueError(f"grpo_state cannot extend the batch column(s) {unknown}: it supports TRL's GRPO "
                         "without a reference model (beta 0), without vLLM importance sampling and without role routes")
    completions, masks, values = [], [], []
    prompt_rows: list[int] = []
    for group, adv in zip(groups, advantages, strict=True):
        if dropped[group.row]:
            continue
        prompt = output["prompt_ids"][group.row][output["prompt_mask"][group.row].bool()].tolist()
        if list(group.context_ids[:len(prompt)]) != prompt:
            raise ValueError(f"the state group of row {group.row} at t={group.t} does not start with its prompt")
        tail = list(group.context_ids[len(prompt):])
        for branch, a in zip(group.branches, adv, strict=True):
            if branch.continued:
                own = next((s for s in segments[group.row] or [] if s.owner is not None and s.owner.produced
                            and s.owner.t == group.t), None)
                if own is not None:
                    output["advantages"][group.row, own.start:own.end] = float(a)
                continue
            ids = list(branch.completion_ids)
            completions.append(tail + ids)
            masks.append([0] * len(tail) + [1] * len(ids))
            values.append([0.0] * len(tail) + [float(a)] * len(ids))
            prompt_rows.append(group.row)
    padding = (-(rows + len(completions))) % multiple_of
    completions += [[]] * padding
    masks += [[]] * padding
    values += [[]] * padding
    prompt_rows += [0] * padding
    if not completions:
        return 0
    width = max(output["completion_ids"].shape[1], max(map(len, completions)))
    device = output["completion_ids"].device

    def padded(seqs: list[list[Any]], fill: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([s + [fill] * (width - len(s)) for s in seqs], dtype=dtype, device=device)

    new = {"prompt_ids": output["prompt_ids"][prompt_rows], "prompt_mask": output["prompt_mask"][prompt_rows],
           "completion_ids": padded(completions, pad_token_id, output["completion_ids"].dtype),
           "completion_mask": padded([[1] * len(c) for c in completions], 0, output["completion_mask"].dtype),
           LOSS_MASK_KEY: padded(masks, 0, output[LOSS_MASK_KEY].dtype),
           "advantages": padded(values, 0.0, output["advantages"].dtype)}
    if "old_per_token_logps" in output:
        with torch.no_grad():
            new["old_per_token_logps"] = logps(new).to(output["old_per_token_logps"].dtype)
    for key, extra in new.items():
        old = output[key]
        if old.dim() == 2 and key not in ("prompt_ids", "prompt_mask") and old.shape[1] < width:
            old = torch.nn.functional.pad(old, (0, width - old.shape[1]), value=pad_token_id if key == "completion_ids"
                                          else 0)
        output[key] = torch.cat([old, extra], dim=0)
    loss_tokens = (new["completion_mask"] * new[LOSS_MASK_KEY]).sum()
    output["num_items_in_batch"] = output["num_items_in_batch"] + gather(loss_tokens).sum()
    return len(completions)


def state_credit(output: dict[str, Any], groups: Sequence[StateGroup], records: Sequence[EpisodeRewards],
                 segments: Sequence[Sequence[Segment] | None], dropped: Sequence[bool], *, scale: bool,
                 verdict_balance: str, logps: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                 gather: Callable[[torch.Tensor], torch.Tensor], multiple_of: int, pad_token_id: int) -> dict[str, float]:
    """``grpo_state``'s step after the reward pipeline: the groups' advantages
    (:func:`state_advantages`, class-balanced with ``verdict_balance: batch``) written into TRL's
    batch (:func:`write_state_credit`); returns :func:`state_metrics` and
    ``credit/state_rows_appended``. ``records``, ``segments`` and ``dropped`` are this process's
    rows; the other arguments as :func:`write_state_credit`'s."""
    advantages = state_advantages(groups, scale=scale)
    if verdict_balance == "batch":
        advantages = balanced_state_advantages(groups, advantages, records)
    appended = write_state_credit(output, groups, advantages, segments, dropped=dropped, logps=logps, gather=gather,
                                  multiple_of=multiple_of, pad_token_id=pad_token_id)
    return {**state_metrics(groups, advantages), "credit/state_rows_appended": float(appended)}
