"""GiGPO: group-in-group advantages without a critic.

Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training" (arXiv 2505.10978):

- Eq. 3, episode level: rollouts of the same prompt form a group; ``A^E = R − mean(group)``
  (``mean_norm``) or ``(R − mean) / std`` (``mean_std_norm``), one value per trajectory; a
  trajectory alone in its group keeps its return.
- Eq. 5, step returns: ``R_t = r_t + γ·R_{t+1}``.
- Eq. 6, anchor-state groups: steps of the same prompt's rollouts whose observations are
  identical (or, with a similarity threshold, similar) form a cluster.
- Eq. 7, step level: ``A^S = R_t − mean(cluster)`` (or divided by the std); a singleton cluster
  gives 0.
- Eq. 8: ``A = A^E + ω·A^S``.

Where the paper is silent the conventions are verl-agent's (the authors' code): Bessel-corrected
std, ``eps = 1e-6``, a lone trajectory keeps its return, a lone step gets 0; all through
:func:`trainer_client.credit.group_norm.group_normalize`. numpy only; float64 inside, float32
out. The reward pipeline applies it per debate turn (:func:`gigpo_turn_values`, which also does
Eq. 8; its step inputs from :func:`trainer_client.credit.step_credit.gigpo_steps`) and spreads
the result over each turn's tokens (``pipeline.token_tensors``). A
by-the-paper reference of Eq. 8 and of all the equations end to end, which the tests compare
against, is in ``tests/helpers/gigpo_reference.py``.
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from env_server.protocol.markers import Role
from trainer_client.credit.group_norm import GIGPO_EPS, group_normalize
from trainer_client.credit.role_samples import RoleSamples

__all__ = [
    "GiGPOConfig",
    "GiGPOInputs",
    "NormMode",
    "anchor_state_groups",
    "discounted_returns",
    "episode_advantages",
    "gigpo_turn_values",
    "step_advantages",
]

NormMode = Literal["mean_norm", "mean_std_norm"]


def _check_mode(mode: str) -> None:
    if mode not in ("mean_norm", "mean_std_norm"):
        raise ValueError(f"mode must be 'mean_norm' or 'mean_std_norm', got {mode!r}")



def episode_advantages(returns: Sequence[float] | np.ndarray, group_ids: Sequence[Hashable],
                       mode: NormMode = "mean_norm", eps: float = GIGPO_EPS) -> np.ndarray:
    """Eq. 3: episode-level advantages (:func:`trainer_client.credit.group_norm.group_normalize`,
    verl-agent's conventions where the paper is silent).

    Args:
        returns: ``(N,)`` total return of each trajectory.
        group_ids: length ``N``; trajectories of the same prompt share an id.
        mode: ``mean_norm`` (``R − mean``) or ``mean_std_norm`` (``(R − mean) / (std + eps)``,
            Bessel-corrected std as verl-agent's ``torch.std``; a zero-std group gives 0).
        eps: added to the std (verl-agent's 1e-6).

    Returns:
        ``(N,)`` float32; a trajectory alone in its group keeps its return (verl-agent: mean 0,
        std 1).

    Raises:
        ValueError: lengths differ, or an unknown mode.
    """
    _check_mode(mode)
    return group_normalize(returns, list(group_ids), scale=mode == "mean_std_norm", eps=eps,
                           singleton="keep").astype(np.float32)


def discounted_returns(step_rewards: Sequence[float | None], gamma: float, default: float = 0.0) -> np.ndarray:
    """Eq. 5: ``R_t = r_t + γ·R_{t+1}`` over one trajectory's steps.

    Args:
        step_rewards: ``(K,)`` rewards ``r_t``; ``None`` (no reward given) counts as ``default``.
        gamma: discount, in ``[0, 1]``.
        default: the reward of a ``None`` step.

    Returns:
        ``(K,)`` float32 returns.

    Raises:
        ValueError: ``gamma`` outside ``[0, 1]``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = np.zeros(len(step_rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(step_rewards) - 1, -1, -1):
        r = step_rewards[t]
        running = (default if r is None else float(r)) + gamma * running
        out[t] = running
    return out.astype(np.float32)


def anchor_state_groups(group_ids: Sequence[Hashable], observations: Sequence[str],
                        similarity_threshold: float | None = None) -> np.ndarray:
    """Eq. 6: cluster steps by anchor state within each prompt group.

    Args:
        group_ids: ``(K,)`` the prompt group of each step's trajectory.
        observations: ``(K,)`` what each step's actor observed (text).
        similarity_threshold: ``None``: identical observations only. A value in ``(0, 1]``:
            a step joins the first cluster (of its group, in order of appearance) whose first
            observation has ``difflib.SequenceMatcher`` ratio ``>= threshold`` with its own.

    Returns:
        ``(K,)`` int64 cluster ids; steps of different groups never share a cluster.

    Raises:
        ValueError: lengths differ, or a threshold outside ``(0, 1]``.
    """
    if len(group_ids) != len(observations):
        raise ValueError(f"{len(group_ids)} group ids for {len(observations)} observations")
    if similarity_threshold is not None and not 0.0 < similarity_threshold <= 1.0:
        raise ValueError(f"similarity_threshold must be in (0, 1], got {similarity_threshold}")
    ids = np.zeros(len(observations), dtype=np.int64)
    exact: dict[tuple[Hashable, str], int] = {}
    representatives: dict[Hashable, list[tuple[str, int]]] = {}
    next_id = 0
    for i, (group, observation) in enumerate(zip(group_ids, observations, strict=True)):
        key = (group, observation)
        if key in exact:
            ids[i] = exact[key]
            continue
        cluster = None
        if similarity_threshold is not None:
            for text, cid in representatives.get(group, []):
                if difflib.SequenceMatcher(None, text, observation).ratio() >= similarity_threshold:
                    cluster = cid
                    break
        if cluster is None:
            cluster, next_id = next_id, next_id + 1
            representatives.setdefault(group, []).append((observation, cluster))
        exact[key] = cluster
        ids[i] = cluster
    return ids


def step_advantages(step_returns: Sequence[float] | np.ndarray, cluster_ids: Sequence[Hashable] | np.ndarray,
                    mode: NormMode = "mean_norm", eps: float = GIGPO_EPS) -> np.ndarray:
    """Eq. 7: ``A^S = R_t − mean(cluster)`` (or divided by the cluster's Bessel-corrected std).

    Args:
        step_returns: ``(K,)`` discounted returns (Eq. 5).
        cluster_ids: ``(K,)`` anchor-state cluster of each step (Eq. 6).
        mode, eps: as :func:`episode_advantages`.

    Returns:
        ``(K,)`` float32; a singleton cluster gives 0.

    Raises:
        ValueError: lengths differ, or an unknown mode.
    """
    _check_mode(mode)
    return group_normalize(step_returns, list(cluster_ids), scale=mode == "mean_std_norm", eps=eps,
                           singleton="zero").astype(np.float32)


class GiGPOConfig(BaseModel):
    """GiGPO advantages (``advantage_estimator: gigpo``; Feng et al. 2025, arXiv 2505.10978).

    Attributes:
        omega: weight of the step-level advantage (Eq. 8).
        gamma: discount of the step returns (Eq. 5).
        mode: ``mean_norm`` (centre) or ``mean_std_norm`` (centre and divide by the std), both
            levels (Eqs. 3, 7).
        similarity_threshold: ``None``: anchor states are identical observations; a value in
            ``(0, 1]`` also groups similar ones (Eq. 6).
        step_reward_default: the reward of a step a user reward function left without one.
    """

    model_config = ConfigDict(extra="forbid")

    omega: float = Field(default=1.0, ge=0)
    gamma: float = Field(default=0.95, ge=0, le=1)
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    similarity_threshold: float | None = Field(default=None, gt=0, le=1)
    step_reward_default: float = 0.0


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


def gigpo_turn_values(samples: RoleSamples, shaped: np.ndarray, rewards: Sequence[Sequence[float]],
                      observations: Sequence[Sequence[str | None]], group_ids: Sequence[Any], omega: float,
                      gamma: float, mode: NormMode = "mean_norm", similarity_threshold: float | None = None
                      ) -> tuple[list[np.ndarray], dict[str, float]]:
    """GiGPO advantages per turn.

    Args:
        samples: the (rollout, role) samples of the batch (``role_samples.build_role_samples``).
        shaped: ``(N,)`` shaped reward per sample (the episode returns of Eq. 3, per role).
        rewards: per rollout, ``r_t`` per turn (Eq. 5).
        observations: per rollout, the acting role's observation per turn (Eq. 6).
        group_ids: per rollout, its prompt group.
        omega, gamma, mode, similarity_threshold: see :class:`~trainer_client.config.GiGPOConfig`.

    Returns:
        Per rollout, a float32 array of per-turn advantages ``A^E + ω·A^S`` (judge turns 0), and
        metrics (``gigpo/anchor_fraction``: share of steps in a cluster of two or more).

    Raises:
        ValueError: lengths disagree.
    """
    if not (len(rewards) == len(observations) == len(group_ids) == len(samples.turn_roles)):
        raise ValueError("rewards, observations, group ids and rollouts differ in length")
    # Eq. 3 per (group, role) over the non-judge samples
    keep = [i for i, role in enumerate(samples.roles) if role is not Role.JUDGE]
    a_e = np.zeros(len(samples.index), dtype=np.float32)
    if keep:
        keys = [(samples.group_ids[i], samples.roles[i]) for i in keep]
        a_e[keep] = episode_advantages(shaped[keep], keys, mode)
    position = {key: i for i, key in enumerate(samples.index)}

    out: list[np.ndarray] = []
    step_returns: list[float] = []
    anchors: list[tuple[Any, str]] = []
    texts: list[str] = []
    owners: list[tuple[int, int]] = []
    for k, roles in enumerate(samples.turn_roles):
        if len(rewards[k]) != len(roles) or len(observations[k]) != len(roles):
            raise ValueError(f"rollout {k}: {len(roles)} turns, {len(rewards[k])} rewards, "
                             f"{len(observations[k])} observations")
        values = np.zeros(len(roles), dtype=np.float32)
        returns = discounted_returns(rewards[k], gamma)  # Eq. 5
        for t, role in enumerate(roles):
            if role is Role.JUDGE:
                continue
            values[t] = a_e[position[(k, role)]]
            step_returns.append(float(returns[t]))
            anchors.append((group_ids[k], role.value))
            observation = observations[k][t]
            texts.append(observation if observation is not None else f"\x00unseen/{k}/{t}")  # never shared
            owners.append((k, t))
        out.append(values)
    if owners:
        clusters = anchor_state_groups(anchors, texts, similarity_threshold)  # Eq. 6
        a_s = step_advantages(step_returns, clusters, mode)  # Eq. 7
        for (k, t), value in zip(owners, a_s, strict=True):
            out[k][t] += omega * value  # Eq. 8
        sizes = np.bincount(clusters)
        anchored = float(np.mean(sizes[clusters] > 1))
    else:
        anchored = 0.0
    return out, {"gigpo/anchor_fraction": anchored}
