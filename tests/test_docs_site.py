"""The documentation site as a reader gets it: ``mkdocs build --strict`` (mkdocs.yml, the hooks in
scripts/mkdocs/) builds, and its configuration reference lists every ``TrainConfig`` field,
nested sections and list entries included, with a description; the README stays a short front
door over it.

The build needs the ``docs`` extra (``scripts/setup_env.sh train,test,docs``, as scripts/test.sh
installs it): without it the build tests skip, except under CI, where that is a failure."""

from __future__ import annotations

import html
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from trainer_client.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _mkdocs() -> str:
    found = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if not found or importlib.util.find_spec("mkdocstrings_handlers") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs or mkdocstrings is missing: they are the `docs` extra (scripts/setup_env.sh train,test,docs)")
        pytest.skip("the `docs` extra is not installed (mkdocs, mkdocstrings)")
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([_mkdocs(), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if not line.startswith("INFO"))
    return out


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field's dotted key, written as the reference writes it (``replay.teachers[].name``
    for the entries of a list); free-form mappings are leaves."""
    paths = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        paths.append(path)
        stack = [(info.annotation, False)]
        while stack:
            annotation, in_list = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                paths += _field_paths(annotation, path + ("[]" if in_list else ""))
            elif typing.get_origin(annotation) is not dict:
                stack += [(arg, in_list or typing.get_origin(annotation) is list) for arg in typing.get_args(annotation)]
    return paths


def test_every_trainconfig_field_is_on_the_built_configuration_page(site):
    page = html.unescape((site / "configuration" / "index.html").read_text())
    shown = set(re.findall(r"<code>([^<]+)</code>", page))
    paths = _field_paths(TrainConfig)
    assert len(paths) > 100 and {"sdpo.alpha", "replay.teachers[].max_tokens", "policies.judge.lora.target_modules",
                                 "channels[].weight", "reward_function.use_score"} <= set(paths)
    missing = [path for path in paths if path not in shown]
    assert not missing, f"TrainConfig fields missing from the built configuration reference: {missing}"


def test_the_site_has_the_repository_pages_and_an_api_page_per_package(site):
    assert (site / "rfcs" / "0001-multiplexed-sessions" / "index.html").exists()
    assert (site / "benchmarks" / "index.html").exists()
    api = html.unescape((site / "reference" / "trainer_client.losses" / "index.html").read_text())
    assert "trainer_client.losses.functional" in api and "generalized_jsd" in api.lower()


def _hooks():
    spec = importlib.util.spec_from_file_location("mathdebate_mkdocs_hooks", ROOT / "scripts" / "mkdocs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_field_without_a_description_is_a_warning_so_the_strict_build_fails(caplog):
    hooks = _hooks()

    class Section(BaseModel):
        """A section.

        Attributes:
            a, b: documented together.
        """

        a: int = 1
        b: list[str] = []
        c: float = 0.5

    class Root(BaseModel):
        """Root.

        Attributes:
            section: the nested one.
        """

        section: Section = Section()

    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.mathdebate"):
        text = hooks.config_reference(Root)
    assert "`section.a`" in text and "`section.b`" in text and "documented together" in text
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "configuration reference: Section.c has no description (add it to the class docstring's Attributes)"]


def test_the_readme_is_a_short_front_door():
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 200 and len(readme.encode()) <= 12 * 1024
    first = "\n".join(lines[:60])
    assert "./scripts/demo.sh" in first and "./scripts/test.sh" in first
    for page in re.findall(r"\]\((docs/[^)#]+)", readme):  # its links into the site's sources exist
        assert (ROOT / page).exists(), page
