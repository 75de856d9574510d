"""The reward pipeline's identity guard: a stored 3-step tiny run fed back to the pipeline.

``data/pipeline_guard.json.gz`` holds, for each of 3 training steps of the pinned ``tiny-sums``
start (``scripts/pipeline_guard.py capture``: ``own_outcome`` credit, hint distillation routed
with SRPO, 16 rollouts in groups of 8), what the pipeline was given (graded records, completion
segments, TRL's masks, the channels' token routes, GiGPO's step inputs) and the ``(B, T)``
advantages, loss mask and ``num_items_in_batch`` the trainer wrote into TRL's batch, with the
``grpo_turn`` and ``gigpo`` estimators' outputs on the same batch. The pipeline must give exactly
those again: a refactor of the credit code that changes one number fails here. (The same script
compares the losses of two live runs: ``scripts/pipeline_guard.py compare``.)
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from env_server.protocol.markers import Role
from env_server.protocol.models import EpisodeRewards
from trainer_client.credit.gigpo import GiGPOInputs
from trainer_client.credit.pipeline import batch_advantages, write_advantages, write_loss_mask
from trainer_client.credit.shaping import get_strategy
from trainer_client.rollout.segments import Segment, SegmentOwner

DATA = Path(__file__).parent / "data" / "pipeline_guard.json.gz"


def _steps() -> list[dict]:
    with gzip.open(DATA, "rt") as fh:
        return json.load(fh)["steps"]


def _owner(owner: list | None) -> SegmentOwner | None:
    return None if owner is None else SegmentOwner(owner[0], Role(owner[1]), owner[2])


def _segments(rows: list) -> list[list[Segment] | None]:
    return [None if row is None else [Segment(start, end, _owner(owner)) for start, end, owner in row] for row in rows]


def _run(step: dict, **settings) -> tuple[dict, object]:
    """The pipeline on a stored step: steps 4-8, then step 9 into a batch holding TRL's masks."""
    records = [EpisodeRewards.model_validate(r) for r in step["records"]]
    strategy = get_strategy("own_outcome")
    result = batch_advantages(records, step["num_generations"], strategy, _segments(step["segments"]),
                              step["completion_length"], step["first_rollout"], **settings)
    output = {"completion_mask": torch.tensor(step["trl_completion_mask"])}
    if step["trl_tool_mask"] is not None:
        output["tool_mask"] = torch.tensor(step["trl_tool_mask"])
    write_advantages(output, result)
    routes = [torch.tensor(r) for r in step["channel_routes"] if r is not None]
    write_loss_mask(output, result, routes, gather=lambda x: x)
    return output, result


@pytest.mark.parametrize("k", [0, 1, 2])
def test_the_stored_run_gives_the_same_advantages_mask_and_token_count(k) -> None:
    step = _steps()[k]
    output, _ = _run(step)
    expected = step["expected"]
    # advantages to float32 rounding: numpy may order a group's sums differently on another CPU's
    # SIMD width (on this machine they are bit-identical; scripts/pipeline_guard.py compares live
    # runs exactly); the mask and the token count exactly
    assert torch.allclose(output["advantages"], torch.tensor(expected["advantages"]), rtol=0, atol=1e-6)
    assert torch.equal(output["tool_mask"], torch.tensor(expected["loss_mask"], dtype=output["tool_mask"].dtype))
    assert float(output["num_items_in_batch"]) == expected["num_items_in_batch"]
    assert (output["advantages"] != 0).any()  # the guard guards something: this batch carries signal
    assert any(r is not None for r in step["channel_routes"])  # and a channel took tokens from GRPO


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["grpo_turn", "gigpo"])
def test_the_stored_run_gives_the_same_result_under_the_other_estimators(k, estimator) -> None:
    step = _steps()[k]
    if estimator == "gigpo":
        steps = step["gigpo_steps"]
        gigpo = GiGPOInputs([s[0] for s in steps], [s[1] for s in steps], omega=1.0, gamma=0.95)
        _, result = _run(step, estimator="gigpo", gigpo=gigpo)
    else:
        _, result = _run(step, estimator="grpo_turn")
    expected = step["variants"][estimator]
    assert torch.allclose(result.advantages, torch.tensor(expected["advantages"]), rtol=0, atol=1e-6)
    assert torch.equal(result.loss_mask, torch.tensor(expected["loss_mask"]))
