"""The ``grpo_turn`` estimator: group normalisation per (prompt, role, that role's k-th turn).

``grpo`` gives every turn of role ``r`` in rollout ``i`` one advantage, normalised over the
(prompt, role) group ``g``. ``grpo_turn`` normalises each turn against the same role's turns at
the same position in the other rollouts of its prompt. For rollout ``i`` of prompt ``g``, role
``r`` with shaped reward ``v_{i,r}``, and ``j`` counting that role's turns from 0 in the order
played, let

    G_{g,r,j} = { i' in g : rollout i' played at least j + 1 turns of role r }

then the advantage of the ``j``-th turn of ``r`` in rollout ``i`` is

    A_{i,r,j} = (v_{i,r} − mean_{i' ∈ G_{g,r,j}} v_{i',r}) / (std_{i' ∈ G_{g,r,j}} v_{i',r} + ε)   if |G_{g,r,j}| ≥ 2,
    A_{i,r,j} = A_{i,r}   (the (prompt, role) advantage of ``grpo``)                               if |G_{g,r,j}| = 1,

with the Bessel-corrected std and ``ε`` = 1e-4 (TRL's), no division when ``scale`` is off, and 0
for a group of zero spread; judge turns get 0. Debates of one prompt differ in length (a
verifier that accepts ends the debate; one that rejects buys the solver another round), so the
later turns' baseline is taken over the rollouts that reached them: a second solver turn is
compared with other second solver turns, not with rollouts whose debate ended after one.

Not AT-GRPO. AT-GRPO (Zhao et al. 2025, "Stronger Together: On-Policy Reinforcement Learning for
Collaborative LLMs", arXiv 2510.11062) also groups by agent and turn, but its groups are
*branches*: at each turn it samples K candidate actions from one shared state and compares
them with each other (same history, per-turn rewards), then continues one of them. Here the
members of a (prompt, role, j) group are the j-th turns of independently sampled rollouts:
their histories differ (different earlier turns), nothing is branched or re-sampled, and the
value compared is the role's shaped episode reward. The baseline is per position, not per state;
it costs no extra generation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

import numpy as np

from env_server.protocol.markers import Role
from trainer_client.credit.group_norm import GRPO_EPS, group_normalize
from trainer_client.credit.role_samples import RoleSamples, role_group_keys

__all__ = ["turn_group_values"]


def turn_group_values(samples: RoleSamples, shaped: np.ndarray, scale: bool = True,
                      eps: float = GRPO_EPS) -> list[np.ndarray]:
    """Per-turn advantages of the ``grpo_turn`` estimator (the module docstring's ``A_{i,r,j}``).

    Args:
        samples: the gathered batch's role samples (rollouts of one prompt share a group id).
        shaped: ``(N,)`` shaped reward per sample.
        scale: divide by ``std + eps``; else only centre.
        eps: added to the std.

    Returns:
        One array per rollout, of length its number of turns (indexed by ``t``), float like
        ``shaped``; judge turns 0.

    Raises:
        ValueError: ``shaped`` is not ``(N,)``, or a non-judge turn has no sample.
    """
    if shaped.shape != (len(samples.index),):
        raise ValueError(f"shaped rewards have shape {shaped.shape}, expected ({len(samples.index)},)")
    fallback = group_normalize(shaped, role_group_keys(samples.roles, samples.group_ids), scale=scale, eps=eps,
                               singleton="zero")
    position = {key: i for i, key in enumerate(samples.index)}
    keys: list[Hashable] = []
    sites: list[tuple[int, int, int]] = []  # (rollout, t, sample)
    for k, roles in enumerate(samples.turn_roles):
        seen: Counter[Role] = Counter()
        for t, role in enumerate(roles):
            if role is Role.JUDGE:
                continue
            if (k, role) not in position:
                raise ValueError(f"rollout {k} turn {t}: no sample for role {role.value!r}")
            i = position[(k, role)]
            keys.append((samples.group_ids[i], role, seen[role]))
            seen[role] += 1
            sites.append((k, t, i))
    values = [float(shaped[i]) for _, _, i in sites]
    normalized = group_normalize(values, keys, scale=scale, eps=eps, singleton="zero")
    sizes = Counter(keys)
    out = [np.zeros(len(roles), dtype=shaped.dtype) for roles in samples.turn_roles]
    for (k, t, i), key, value in zip(sites, keys, normalized, strict=True):
        out[k][t] = value if sizes[key] > 1 else fallback[i]
    return out
