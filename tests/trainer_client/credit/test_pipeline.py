"""The reward pipeline is the one writer of TRL's advantages and loss mask, and checks what it writes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from trainer_client.credit.pipeline import BatchAdvantages, write_advantages, write_loss_mask
from trainer_client.trl_compat import LOSS_MASK_KEY

ROOT = Path(__file__).resolve().parents[3] / "trainer_client"
PIPELINE = ROOT / "credit" / "pipeline.py"
STATE_GROUPS = ROOT / "credit" / "state_groups.py"  # step 10, grpo_state's rows
#: The keys of TRL's batch that hold what the loss weighs each token by (trl 1.16).
LOSS_INPUT_KEYS = {"advantages", LOSS_MASK_KEY, "num_items_in_batch"}


def loss_input_writes(source: str) -> list[int]:
    """Line numbers where ``source`` writes one of :data:`LOSS_INPUT_KEYS` into a mapping:
    ``x["advantages"] = ...`` (also augmented or annotated), ``x[LOSS_MASK_KEY] = ...``,
    ``x.update(advantages=...)``, ``x.update({"advantages": ...})`` or ``x.setdefault("advantages", ...)``."""

    def names_key(node: ast.expr) -> bool:
        return ((isinstance(node, ast.Constant) and node.value in LOSS_INPUT_KEYS)
                or (isinstance(node, ast.Name) and node.id == "LOSS_MASK_KEY"))

    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Subscript) and names_key(sub.slice):
                    lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "update" and (any(k.arg in LOSS_INPUT_KEYS for k in node.keywords) or any(
                    isinstance(a, ast.Dict) and any(k is not None and names_key(k) for k in a.keys) for a in node.args)):
                lines.append(node.lineno)
            if node.func.attr == "setdefault" and node.args and names_key(node.args[0]):
                lines.append(node.lineno)
    return lines


def test_no_module_but_the_pipeline_writes_the_advantages_or_the_loss_mask() -> None:
    writers = {str(path.relative_to(ROOT.parent)): loss_input_writes(path.read_text())
               for path in ROOT.rglob("*.py") if path not in (PIPELINE, STATE_GROUPS)}
    assert {path: lines for path, lines in writers.items() if lines} == {}
    assert len(loss_input_writes(PIPELINE.read_text())) == 3  # advantages, the loss mask, num_items_in_batch
    assert len(loss_input_writes(STATE_GROUPS.read_text())) == 2  # the continued turn's advantage, num_items_in_batch


@pytest.mark.parametrize("snippet", [
    'output["advantages"] = a', "batch[LOSS_MASK_KEY] = m", 'out["tool_mask"] *= m', 'o["num_items_in_batch"]: int = 3',
    "output.update(advantages=a)", 'output.update({"tool_mask": m})', 'output.setdefault("advantages", a)',
])
def test_the_check_sees_every_way_of_writing_them(snippet: str) -> None:
    assert loss_input_writes(snippet) == [1]
    assert loss_input_writes('x = output["advantages"]; output["prompt_ids"] = p') == []  # reads and other keys pass


def _result(advantages: torch.Tensor, mask: torch.Tensor) -> BatchAdvantages:
    return BatchAdvantages(advantages, mask, samples=None, shaped=None)  # type: ignore[arg-type]  # step 9 reads neither


def test_step_9_multiplies_trl_s_mask_the_pipeline_s_and_every_route_and_counts_what_is_left() -> None:
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    output = {"completion_mask": completion_mask, "tool_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])}
    result = _result(torch.tensor([[0.5] * 4, [-1.0] * 4]), torch.tensor([[True, True, True, False], [True] * 4]))
    write_advantages(output, result)
    write_loss_mask(output, result, [torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]]), torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])],
                    gather=lambda x: x.reshape(1))
    assert torch.equal(output["advantages"], result.advantages)
    assert output["tool_mask"].tolist() == [[1, 0, 0, 0], [0, 1, 1, 1]]
    assert int(output["num_items_in_batch"]) == 1 + 2  # row 2's last token is padding


def test_step_9_without_trl_s_mask_starts_from_ones_and_refuses_a_wrong_shape() -> None:
    output = {"completion_mask": torch.ones(2, 3, dtype=torch.long)}
    result = _result(torch.zeros(2, 3), torch.tensor([[True, False, True]] * 2))
    write_loss_mask(output, result, [], gather=lambda x: x)
    assert output[LOSS_MASK_KEY].tolist() == [[1, 0, 1]] * 2
    with pytest.raises(ValueError, match=r"route has shape \(2, 4\), the batch \(2, 3\)"):
        write_loss_mask(output, result, [torch.ones(2, 4)], gather=lambda x: x)
    with pytest.raises(ValueError, match="advantages has shape"):
        write_advantages(output, _result(torch.zeros(3, 3), result.loss_mask))
