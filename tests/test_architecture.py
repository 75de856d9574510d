"""The server's module map, enforced: each ``env_server`` module imports only the modules
``docs/architecture.md`` allows it, so the layering (domain -> service -> transports -> app)
cannot erode unnoticed. Also checks the wire-type tables derived from ``models``."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

import env_server.models as models
from env_server.frames import _PREFIXES
from env_server.transport_mux import MuxConnection

PACKAGE = Path(__file__).resolve().parents[1] / "env_server"

#: module -> the env_server modules it may import (the package root, for ``__version__``, always)
ALLOWED: dict[str, set[str]] = {
    # leaves
    "markers": set(),
    "answers": set(),
    "auth": set(),
    "payloads": set(),
    "grading_preload": {"grading_worker"},
    "problems": {"problems"},
    # wire and domain types
    "models": {"markers", "_deprecated_models"},  # the latter lazily, behind the deprecation hook
    "_deprecated_models": {"markers", "models"},
    "grades": {"markers"},
    "errors": {"markers", "models"},
    "prompts": {"markers"},
    # grading
    "closed_form": {"answers", "grades"},
    "grading_worker": {"grades"},
    "grading": {"answers", "closed_form", "grades", "grading_worker", "markers"},
    "config": {"grading", "markers"},
    # the episode and its bookkeeping
    "debate": {"answers", "errors", "markers", "models", "problems", "prompts"},
    "rewards": {"debate", "grades", "markers"},
    "episodes": {"debate", "errors", "grades", "models"},
    "sessions": {"episodes", "errors"},
    "journal": {"grades", "markers"},  # the state journal: frames of plain values, no domain objects
    # the facade: no wire envelopes (frames), no transport
    "service": {"config", "debate", "episodes", "errors", "grades", "grading", "journal", "markers", "models",
                "payloads", "problems", "rewards", "sessions"},
    # transports and the app: through the service only (no sessions, episodes, debate)
    "frames": {"errors", "markers", "models"},
    "transport_mux": {"errors", "frames", "models", "service"},
    "transport_openenv": {"errors", "frames", "models", "service"},
    "routes_openenv": {"errors", "frames", "models", "service"},
    "routes_extensions": {"markers", "models", "service"},
    "routes_ui": {"auth", "errors", "markers", "models"},  # reads episodes through a source protocol, not the service
    "routes_ws": {"auth", "frames", "models", "service", "transport_mux", "transport_openenv"},
    "app": {"auth", "config", "errors", "frames", "models", "routes_extensions", "routes_openenv", "routes_ui", "routes_ws",
            "service"},
    # clients and tools
    "client": {"markers", "models"},
    "replicas": {"client"},
    "play": {"answers", "client", "markers", "models", "problems", "replicas"},
    "cli": {"app", "config", "grading", "markers", "play", "problems", "view"},
    "view": {"errors", "markers", "models", "problems", "routes_ui"},
    "asgi": {"app", "cli"},  # the entry module OpenEnv's package layout names (openenv.yaml)
}


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE).with_suffix("")
    return "problems" if relative.parts[0] == "problems" else relative.parts[0]


def _imports(path: Path) -> set[str]:
    """First component under ``env_server`` of every import in ``path`` (any depth, lazy ones too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] in ("torch", "trainer_client"):
                found.add(parts[0])
            if parts[0] == "env_server" and len(parts) > 1 and (
                    (PACKAGE / parts[1]).with_suffix(".py").exists() or (PACKAGE / parts[1]).is_dir()):
                found.add(parts[1])
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_module_imports_only_what_the_module_map_allows(path: Path) -> None:
    module = _module_name(path)
    assert module in ALLOWED, f"{module} is not in the module map: add it here and to docs/architecture.md"
    extra = _imports(path) - ALLOWED[module] - {module}
    assert not extra, f"env_server/{path.relative_to(PACKAGE)} imports {sorted(extra)}, outside the module map"


def test_the_module_map_lists_no_module_that_does_not_exist() -> None:
    assert set(ALLOWED) == {_module_name(p) for p in SOURCES}


def test_the_module_map_document_names_every_module() -> None:
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = [name for name in ALLOWED if f"`{name}" not in doc]
    assert not missing, f"docs/architecture.md does not describe {missing}"


def test_frame_type_tables_are_derived_from_the_models() -> None:
    assert set(models.CLIENT_FRAME_TYPES) == {"open", "attach", "reset", "step", "state", "rewards", "close", "ping"}
    assert set(_PREFIXES) == set(models.SERVER_FRAME_TYPES)
    handlers = MuxConnection.__new__(MuxConnection)
    MuxConnection.__init__(handlers, websocket=None, service=None)  # type: ignore[arg-type]  # only the handler table is read
    assert set(handlers._handlers) == set(models.CLIENT_FRAME_TYPES)


@pytest.mark.parametrize("name", ["StepMetadata", "ErrorData", "ServerFrame"])
def test_removed_model_names_still_import_for_one_release_with_a_warning(name: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = getattr(models, name)
    assert model.__name__ == name
    assert any(issubclass(w.category, DeprecationWarning) and name in str(w.message) for w in caught)
    assert name not in models.__all__
    with pytest.raises(AttributeError):
        _ = models.NoSuchName  # type: ignore[attr-defined]  # the point: an unknown name


def test_every_suppression_says_why_on_its_line() -> None:
    """``# noqa`` and ``# type: ignore`` are allowed only with a reason written after them."""
    import re

    bare = re.compile(r"#\s*(noqa(:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^\]]*\])?)\s*$")
    root = PACKAGE.parent
    offenders = [f"{path.relative_to(root)}:{n}" for folder in ("env_server", "trainer_client", "benchmarks", "tests")
                 for path in sorted((root / folder).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if bare.search(line)]
    assert not offenders, f"suppressions without a reason: {offenders}"
