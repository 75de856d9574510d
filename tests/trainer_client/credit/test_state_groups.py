"""``grpo_state`` (AT-GRPO's within-state groups): the advantages by hand, the continuation, how a
reply becomes an action, and the rows written into TRL's batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from records import make_record

from env_server.protocol.markers import Role
from trainer_client.credit.state_groups import (
    balanced_state_advantages,
    state_advantages,
    state_metrics,
    write_state_credit,
)
from trainer_client.rollout.branches import (
    StateBranch,
    StateGroup,
    StateSettings,
    branched,
    choose_continuation,
    reply_action,
)
from trainer_client.rollout.segments import Segment
from trainer_client.rollout.tools import FORFEIT_ACTION


def group(rewards, row=0, t=1, role=Role.VERIFIER, continued=0, context=(5, 6, 7), lengths=None):
    lengths = lengths or [2] * len(rewards)
    return StateGroup(row, t, role, tuple(context), tuple(
        StateBranch(tuple(range(100 + 10 * k, 100 + 10 * k + n)), f"a{k}", r, k == continued)
        for k, (r, n) in enumerate(zip(rewards, lengths, strict=True))))


def test_advantages_by_hand() -> None:
    # rewards 1, 0, 0, 1: mean 0.5, Bessel std sqrt(1/3) = 0.57735
    (scaled,) = state_advantages([group([1.0, 0.0, 0.0, 1.0])], scale=True)
    assert scaled.tolist() == pytest.approx([v / (math.sqrt(1 / 3) + 1e-4) for v in (0.5, -0.5, -0.5, 0.5)])
    (centred,) = state_advantages([group([1.0, 0.0, 0.0, 1.0])], scale=False)
    assert centred.tolist() == [0.5, -0.5, -0.5, 0.5]
    # one group's rewards never reach another's baseline; an ungraded branch is out of its group
    a, b = state_advantages([group([1.0, 1.0, 1.0]), group([1.0, None, 0.0], row=1)], scale=False)
    assert a.tolist() == [0.0, 0.0, 0.0] and b.tolist() == [0.5, 0.0, -0.5]
    metrics = state_metrics([group([1.0, 1.0, 1.0]), group([1.0, None, 0.0], row=1)], [a, b])
    assert metrics == {"credit/state_groups": 2.0, "credit/state_groups_nonzero": 0.5,
                       "credit/state_branch_reward": 0.8, "credit/state_branches_ungraded": 1.0}


def test_continuation_and_settings() -> None:
    assert choose_continuation([0.0, 1.0, 1.0], "sampled") == 0
    assert choose_continuation([0.0, 1.0, 1.0], "best") == 1  # the first of equals
    assert choose_continuation([None, 0.0, None], "best") == 1
    assert choose_continuation([None, None], "best") == 0
    with pytest.raises(ValueError):
        choose_continuation([1.0], "worst")  # type: ignore[arg-type]  # an invalid value on purpose
    with pytest.raises(ValueError):
        StateSettings(branches=1)
    with pytest.raises(ValueError):
        StateSettings(continuation="random")  # type: ignore[arg-type]  # an invalid value on purpose


def test_which_turns_branch_and_what_a_reply_plays() -> None:
    from env_server.protocol.models import DebateObservation

    def obs(role, t):
        return DebateObservation.model_construct(role=role, t=t)

    assert branched(obs(Role.VERIFIER, 1)) and branched(obs(Role.SOLVER, 2))
    assert not branched(obs(Role.SOLVER, 0)) and not branched(obs(Role.JUDGE, 2)) and not branched(obs(None, 3))
    call = {"type": "function", "function": {"name": "submit_verdict",
                                             "arguments": {"verdict": "INCORRECT", "critique": "2+2 is 4"}}}
    played = reply_action({"role": "assistant", "content": "", "tool_calls": [call]}, Role.VERIFIER)
    assert "INCORRECT" in played and "2+2 is 4" in played
    assert reply_action({"content": "", "tool_calls": [call]}, Role.SOLVER) == FORFEIT_ACTION  # another role's tool
    wrong_args = {"type": "function", "function": {"name": "submit_verdict", "arguments": {"verdict": "CORRECT"}}}
    assert reply_action({"content": "", "tool_calls": [wrong_args]}, Role.VERIFIER) == FORFEIT_ACTION
    assert reply_action({"content": "  VERDICT: CORRECT "}, Role.VERIFIER) == "VERDICT: CORRECT"  # the fallback
    assert reply_action({"content": "  "}, Role.VERIFIER) == FORFEIT_ACTION


def test_balanced_credit_weights_a_verifier_group_by_its_reviewed_class() -> None:
    # three rollouts reviewing right answers, one a wrong one: w_right = 4 / (2·3), w_wrong = 4 / (2·1)
    records = [make_record([True], [True], True, k) for k in "abc"] + [make_record([False], [False], True, "d")]
    groups = [group([1.0, 0.0], row=0), group([1.0, 0.0], row=3)]
    out = balanced_state_advantages(groups, [np.array([0.5, -0.5]), np.array([0.5, -0.5])], records)
    assert out[0].tolist() == pytest.approx([0.5 * 4 / 6, -0.5 * 4 / 6]) and out[1].tolist() == [1.0, -1.0]


def test_rows_written_into_the_batch() -> None:
    # two rollouts; prompt "1 2" (row 0 left-padded), completion of width 6
    pad = 0
    output = {
        "prompt_ids": torch.tensor([[pad, 1, 2], [1, 2, 3]]), "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[5, 6, 7, 8, 9, pad], [4, 4, 4, 4, 4, 4]]),
        "completion_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1] * 6]),
        "tool_mask": torch.tensor([[1, 0, 0, 1, 1, 0], [1] * 6]),
        "advantages": torch.full((2, 6), 0.25), "num_items_in_batch": torch.tensor(9.0),
    }
    # row 0's verifier turn t=1 sampled after "1 2 | 5 6 7" (the solver's token 5, tool result 6 7): its own
    # action is tokens 3..5 of its completion (8 9), two more actions of 3 and 1 tokens
    g = group([1.0, 0.0, 1.0], row=0, t=1, context=(1, 2, 5, 6, 7), lengths=[2, 3, 1])
    segments = [[Segment.of(0, "solver", 0, 1), Segment.of(1, "verifier", 3, 5)], [Segment.of(0, "solver", 0, 6)]]
    advantages = state_advantages([g], scale=False)  # 1/3, -2/3, 1/3
    appended = write_state_credit(output, [g], advantages, segments, dropped=[False, False],
                                  logps=lambda batch: pytest.fail("no old log-probs in this batch"),
                                  gather=lambda x: x, multiple_of=2, pad_token_id=pad)
    assert appended == 2 and output["completion_ids"].shape == (4, 6)
    assert output["advantages"][0].tolist() == pytest.approx([0.25, 0.25, 0.25, 1 / 3, 1 / 3, 0.25])  # own turn
    assert output["prompt_ids"][2:].tolist() == [[pad, 1, 2]] * 2
    assert output["completion_ids"][2].tolist() == [5, 6, 7, 110, 111, 112]
    assert output["completion_ids"][3].tolist() == [5, 6, 7, 120, pad, pad]
    assert output["tool_mask"][2:].tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0]]
    assert output["completion_mask"][3].tolist() == [1, 1, 1, 1, 0, 0]
    assert output["advantages"][2].tolist() == pytest.approx([0, 0, 0] + [-2 / 3] * 3)
    assert output["advantages"][3].tolist() == pytest.approx([0, 0, 0, 1 / 3, 0, 0])
    assert output["num_items_in_batch"].item() == 9 + 4
    # a branch longer than the batch widens it; an odd count is padded with an empty row; a dropped row is skipped
    long = group([0.0, 1.0], row=1, t=1, context=(1, 2, 3, 4), lengths=[1, 8])
    out2 = {k: v.clone() for k, v in output.items()}
    assert write_state_credit(out2, [long, group([1.0, 0.0], row=0)], state_advantages([long, group([1.0, 0.0])],
                              scale=False), segments, dropped=[True, False], logps=lambda b: None,
                              gather=lambda x: x, multiple_of=2, pad_token_id=pad) == 2
    assert out2["completion_ids"].shape == (6, 9)
    assert out2["completion_ids"][4].tolist() == [4, *range(110, 118)]  # prompt 1 2 3, tail 4, 8 tokens
    assert out2["tool_mask"][5].tolist() == [0] * 9 and out2["advantages"][5].abs().sum() == 0  # the empty row
    # a group whose context does not start with its row's prompt is refused; so is a column it cannot extend
    with pytest.raises(ValueError, match="prompt"):
        write_state_credit(dict(output), [group([1.0, 0.0], row=1, context=(9, 9, 9, 9))], [np.zeros(2)], segments,
                           dropped=[False] * 4, logps=lambda b: None, gather=lambda x: x, multiple_of=1, pad_token_id=0)
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        write_state_credit({**output, "ref_per_token_logps": torch.zeros(4, 6)}, [], [], segments,
                           dropped=[False] * 4, logps=lambda b: None, gather=lambda x: x, multiple_of=1, pad_token_id=0)
