"""Shared fixtures. ``../shared/data`` (beside the repo) holds MATH-500 and GSM8K; tests read
them in place and never copy them into the repo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
MATH500 = SHARED_DATA / "math500.jsonl"
GSM8K = SHARED_DATA / "gsm8k_test.jsonl"


def _allowed_seconds(item: pytest.Item) -> float:
    """The test's ``timeout`` mark, or the suite's default (pyproject.toml)."""
    mark = item.get_closest_marker("timeout")
    return float(mark.args[0]) if mark and mark.args else float(item.config.getini("timeout") or 0)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules holding a test marked ``slow`` first, the one allowed the longest (its ``timeout``
    mark) first among them; each module's own order kept.

    Only in pytest-xdist's workers (``scripts/test.sh`` with ``MATHDEBATE_PYTEST_WORKERS``: ``--dist
    loadfile --no-loadscope-reorder`` hands whole modules to the workers in collection order): the
    longest first (longest-processing-time-first scheduling) keeps one worker from starting a
    four-minute module while the others have run dry. In one process the collection order stays:
    there the slowest trainings run late, after the background parts' installs and image builds
    have given the cores back."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    weight: dict[object, float] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            weight[item.path] = max(weight.get(item.path, 0.0), _allowed_seconds(item))
    items.sort(key=lambda item: -weight.get(item.path, -1.0))  # a stable sort: each module's order is kept


@pytest.fixture(scope="session")
def math500_path() -> Path:
    if not MATH500.exists():
        pytest.fail(f"MATH-500 not found at {MATH500}: ../shared/data must sit beside the repo")
    return MATH500


@pytest.fixture(scope="session")
def gsm8k_path() -> Path:
    if not GSM8K.exists():
        pytest.fail(f"GSM8K not found at {GSM8K}: ../shared/data must sit beside the repo")
    return GSM8K


# --------------------------------------------------------------------------- live servers

from collections.abc import Iterator  # noqa: E402  after the environment set-up above

from env_server.cli import running_server  # noqa: E402  after the environment set-up above


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A real server (subprocess, real socket) on the built-in generator, default limits
    except a short grading timeout so hostile answers resolve quickly."""
    with running_server(["--grading-timeout", "2", "--grading-workers", "2"]) as url:
        yield url


@pytest.fixture(scope="session")
def math500_server_url(math500_path) -> Iterator[str]:
    """A real server serving MATH-500 from ../shared/data."""
    with running_server(["--problems", str(math500_path), "--grading-workers", "2"]) as url:
        yield url


@pytest.fixture(scope="session")
def tiny_learning_dir(tmp_path_factory) -> str:
    """The learning experiment's tiny model (``tiny_model.learning_spec``): its committed build
    (``trainer_client/tiny_models/pinned/tiny-learning``, the same weights on every machine and
    thread count), copied once per test session. ``MATHDEBATE_TEST_TINY_LEARNING_MODEL`` may name
    a directory to copy into and reuse."""
    from trainer_client.tiny_models.build import build_tiny_model
    from trainer_client.tiny_models.recipes import learning_spec

    target = os.environ.get("MATHDEBATE_TEST_TINY_LEARNING_MODEL") or tmp_path_factory.mktemp("tiny-learning")
    return str(build_tiny_model(target, learning_spec()))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The offline tiny model: its committed build (``trainer_client/tiny_models/pinned/tiny``, the
    same weights on every machine and thread count), copied once per test session.
    ``MATHDEBATE_TEST_TINY_MODEL`` may name a directory to copy into and reuse."""
    from trainer_client.tiny_models.build import build_tiny_model

    target = os.environ.get("MATHDEBATE_TEST_TINY_MODEL") or tmp_path_factory.mktemp("tiny-model")
    return str(build_tiny_model(target))
