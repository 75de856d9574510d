"""The tiny models' committed builds: the recipes they were built from, and weights that load the
same whatever the torch thread count (a rebuild does not: the warm-up's sums depend on it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_client.tiny_models.build import PINNED_DIR, build_tiny_model, pinned_build, tiny_model_path
from trainer_client.tiny_models.recipes import tiny_model_spec

PINNED = sorted(p.name for p in PINNED_DIR.iterdir() if (p / "tiny_model.json").exists())

#: Loads every folder afresh under each thread count, one line per count. One process for both
#: counts: its first ``from_pretrained`` costs ~12 s of lazy imports, which a second process paid again.
_FINGERPRINT = """
import sys, torch
from transformers import AutoModelForCausalLM
from trainer_client.model.fingerprint import weights_fingerprint
for threads in (1, 2):
    torch.set_num_threads(threads)
    print(torch.get_num_threads(), *(weights_fingerprint(AutoModelForCausalLM.from_pretrained(p)) for p in sys.argv[1:]))
"""


#: The default trace-replay teachers of the protocol's start (``tiny_model_teachers("tiny-sums")``).
TEACHERS = ["tiny-sums@1", "tiny-sums@2", "tiny-sums@3"]


def test_the_protocol_models_are_committed() -> None:
    """The starting policies and the default teachers of ``tiny-sums`` (``tiny-sums@1..3``, 18,000
    warm-up steps each: about 40 minutes of one core that a replay arm no longer spends), and
    ``tiny-div``, the start of the family where checking is cheaper than solving (issue 54), and
    ``tiny-div-r2``, its two-round warm-up (revision turns)."""
    for name in ("tiny", "tiny-learning", "tiny-sums", *TEACHERS, "tiny-div", "tiny-div-r2"):
        assert name in PINNED, f"{name} has no committed build in {PINNED_DIR}"


def test_the_default_teachers_load_from_the_repository(tmp_path: Path) -> None:
    """A replay run on ``tiny-sums`` without ``replay.teachers`` gets the committed teachers: each
    default teacher resolves to its folder under :data:`PINNED_DIR` and nothing is built."""
    from trainer_client.config import tiny_model_teachers
    from trainer_client.losses.teachers import TeacherConfig
    from trainer_client.training.train import resolve_tiny_teachers

    teachers = [TeacherConfig(**t) for t in tiny_model_teachers("tiny-sums")]
    assert [t.name for t in teachers] == TEACHERS
    resolved = resolve_tiny_teachers(teachers, tmp_path)
    assert [t.model for t in resolved] == [str(PINNED_DIR / name) for name in TEACHERS]
    assert not any(tmp_path.iterdir()), "nothing is built when the teachers are committed"


@pytest.mark.parametrize("name", PINNED)
def test_a_committed_build_is_its_recipes_and_is_what_tiny_model_path_returns(name: str, tmp_path: Path) -> None:
    """A recipe changed without a new commit of its build would silently fall back to a rebuild:
    the committed folder must carry the hash of the recipe its name resolves to today."""
    folder = PINNED_DIR / name
    marker = json.loads((folder / "tiny_model.json").read_text())
    assert pinned_build(tiny_model_spec(name)) == folder, f"{name}: the committed build is not its recipe's"
    assert len(marker["fingerprint"]) == 64 and marker["built_with"]["threads"] >= 1
    assert tiny_model_path(name, tmp_path) == folder
    assert not any(tmp_path.iterdir()), "nothing is built when the recipe is committed"


def test_committed_weights_load_identically_under_one_and_two_torch_threads(tmp_path: Path) -> None:
    """``tiny``, ``tiny-sums`` and its default teachers, ``tiny-div`` and ``tiny-div-r2``, from the
    committed folder and from the copy a caller with its own folder gets, each loaded afresh (in a
    process of its own) under 1 and then under 2 torch threads: every load gives the fingerprint
    recorded at the build."""
    names = ["tiny", "tiny-sums", *TEACHERS, "tiny-div", "tiny-div-r2"]
    recorded = [json.loads((PINNED_DIR / name / "tiny_model.json").read_text())["fingerprint"] for name in names]
    folders = [str(PINNED_DIR / name) for name in names]
    copies = [str(build_tiny_model(tmp_path / name, tiny_model_spec(name))) for name in names]
    lines = subprocess.run([sys.executable, "-c", _FINGERPRINT, *folders, *copies], check=True,
                           capture_output=True, text=True).stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2"], lines
    for line in lines:
        assert line.split()[1:] == recorded + recorded, line
