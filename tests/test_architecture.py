"""The package map, enforced: the import contracts (import-linter, declared in pyproject.toml)
hold and catch a violation; every documented import path imports; modules stay small; only
``trainer_client.trl_compat`` touches TRL's privates; the server's commands start without the
trainer; the wire-type tables are derived from the models."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

import env_server.protocol.models as models
from env_server.protocol.frames import _PREFIXES
from env_server.transport.mux import MuxConnection

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("env_server", "trainer_client", "math_debate")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(cwd / "pyproject.toml"), "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, timeout=240, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)})


def test_import_contracts_hold() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "added", "contract"), [
    ("env_server/protocol/markers.py", "import env_server.service.facade", "env_server layers"),
    ("env_server/debate/answers.py", "import torch", "never imports torch"),
    ("trainer_client/rollout/segments.py", "import trainer_client.losses.base", "trainer_client layers"),
    ("trainer_client/evaluation/policies.py", "def f():\n    import trainer_client.evaluation.specs", "no import cycles"),
    # the contracts cover whole packages: any module of a forbidden package breaks them
    ("env_server/client/play.py", "import env_server.grading.worker", "clients never load"),
    ("trainer_client/credit/fidelity.py", "import env_server.service.journal", "trainer_client uses env_server"),
    # an import only for type checking counts too (the circles through TYPE_CHECKING are gone)
    ("trainer_client/rollout/trace.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    import trainer_client.rollout.environment", "no import cycles"),
])
def test_the_contracts_fail_on_a_violation(tmp_path: Path, module: str, added: str, contract: str) -> None:
    """A copy of the tree with one forbidden import (a lazy one for the cycle) breaks its contract."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "ui"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\n{added}\n")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    broken = done.stdout[done.stdout.index("Broken contracts"):]
    assert contract in broken, broken[:2000]


def _doc_pages() -> list[Path]:
    """The docs site's own pages (docs/, less the experiment records under docs/ablation/)."""
    return sorted(p for p in (ROOT / "docs").rglob("*.md") if "ablation" not in p.relative_to(ROOT / "docs").parts)


def _documented_paths() -> set[str]:
    """Dotted ``env_server.*`` / ``trainer_client.*`` names (``module:attr`` too) that README.md,
    the docs site's pages, rfcs/, configs/ and openenv.yaml show."""
    texts = [ROOT / "README.md", ROOT / "openenv.yaml", *_doc_pages(), *sorted((ROOT / "rfcs").glob("*.md")),
             *sorted((ROOT / "configs").glob("*.yaml"))]
    found: set[str] = set()
    for path in texts:
        for match in re.finditer(r"\b((?:env_server|trainer_client)(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?)", path.read_text()):
            name = match.group(1).rstrip(".")
            if not re.search(r"\.(py|md|jsonl|yaml)$", name):
                found.add(name)
    return found


def _resolve(name: str) -> object:
    """Import ``a.b.c`` as a module, or as attribute ``c`` of module ``a.b`` (``a.b:c`` too)."""
    if ":" in name:
        module, _, attr = name.partition(":")
        return getattr(import_module(module), attr)
    try:
        return import_module(name)
    except ModuleNotFoundError:
        module, _, attr = name.rpartition(".")
        return getattr(_resolve(module), attr)


def test_every_documented_import_path_imports() -> None:
    paths = _documented_paths()
    # the README's own examples, at least
    assert {"env_server.client.MuxClient", "env_server.client.replicas.ReplicaPool", "env_server.asgi:app",
            "trainer_client.environment_factory", "trainer_client.config.TrainConfig"} <= paths
    failed = {}
    for name in sorted(paths):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            failed[name] = repr(exc)
    assert not failed, failed


def test_the_readme_import_examples_run() -> None:
    """The ``from X import a, b`` lines of the code blocks of the README and the docs pages import as written."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *_doc_pages()])
    lines = re.findall(r"^from ((?:env_server|trainer_client)[\w.]*) import ([\w, ]+)$", text, re.M)
    assert len(lines) >= 4
    for module, names in lines:
        imported = import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(imported, name), f"from {module} import {name}"


def test_no_module_is_over_500_lines_unless_it_says_why() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > 500
            and "longer than 500 lines" not in (ast.get_docstring(ast.parse(p.read_text())) or "")}
    assert not long, long
    assert len((ROOT / "trainer_client" / "trainer.py").read_text().splitlines()) <= 300


def _trl_privates() -> set[str]:
    """Single-underscore names defined by TRL's GRPOTrainer or its ``trl.trainer.utils``."""
    from trl.trainer import grpo_trainer, utils

    names = {n for n in vars(grpo_trainer.GRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    names |= {n for n in vars(utils) if n.startswith("_") and not n.startswith("__")}
    names |= {"_metrics"}  # an instance attribute, set in __init__
    return names


def _trl_private_uses(path: Path, privates: set[str]) -> list[str]:
    """Where ``path`` touches a TRL private: a method of that name defined in a trainer class
    (overriding TRL's), an attribute of that name read off ``self`` in a trainer class or off
    a trainer object (``trainer``, ``self.trainer``), or an ``_name`` imported from ``trl``."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trl"):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("_")]
        if not isinstance(node, ast.ClassDef):
            continue
        trainer_class = any("Trainer" in ast.unparse(base) or "GRPOHooks" in ast.unparse(base) for base in node.bases)
        for child in ast.walk(node):
            if trainer_class and isinstance(child, ast.FunctionDef) and child.name in privates:
                found.append(f"{child.lineno}: def {child.name}")
            if (isinstance(child, ast.Attribute) and child.attr in privates
                    and ((trainer_class and ast.unparse(child.value) == "self")
                         or ast.unparse(child.value) in ("trainer", "self.trainer"))):
                found.append(f"{child.lineno}: {ast.unparse(child)}")
    return found


def test_only_trl_compat_touches_trl_privates() -> None:
    privates = _trl_privates()
    assert {"_generate", "_generate_and_score_completions", "_metrics"} <= privates
    offenders = {str(p.relative_to(ROOT)): uses for p in _sources()
                 if p.name != "trl_compat.py" and (uses := _trl_private_uses(p, privates))}
    assert not offenders, offenders
    # and the check sees what it looks for
    assert _trl_private_uses(ROOT / "trainer_client" / "trl_compat.py", privates)


def test_trl_compat_names_the_supported_range() -> None:
    from trainer_client.trl_compat import check_trl_version

    assert check_trl_version().startswith("1.16")
    with pytest.raises(ImportError, match=r"trl >=1\.16,<1\.17.*found trl 1\.17\.0"):
        check_trl_version("1.17.0")


@pytest.mark.parametrize("command", ["serve", "play", "view"])
def test_server_commands_start_without_the_trainer(command: str) -> None:
    code = ("import sys\nfrom trainer_client.cli import main\n"
            f"try:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'transformers', 'trl', 'trainer_client.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['trainer_client.cli']"


def test_frame_type_tables_are_derived_from_the_models() -> None:
    assert set(models.CLIENT_FRAME_TYPES) == {"open", "attach", "reset", "step", "state", "fork", "rewards", "close", "ping"}
    assert set(_PREFIXES) == set(models.SERVER_FRAME_TYPES)
    handlers = MuxConnection.__new__(MuxConnection)
    MuxConnection.__init__(handlers, websocket=None, service=None)  # type: ignore[arg-type]  # only the handler table is read
    assert set(handlers._handlers) == set(models.CLIENT_FRAME_TYPES)


def test_every_suppression_says_why_on_its_line() -> None:
    """``# noqa`` and ``# type: ignore`` are allowed only with a reason written after them."""
    bare = re.compile(r"#\s*(noqa(:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^\]]*\])?)\s*$")
    offenders = [f"{path.relative_to(ROOT)}:{n}" for folder in ("env_server", "trainer_client", "benchmarks", "tests")
                 for path in sorted((ROOT / folder).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if bare.search(line)]
    assert not offenders, f"suppressions without a reason: {offenders}"


def test_docs_architecture_names_every_package_and_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for path in _sources():
        relative = path.relative_to(ROOT).with_suffix("")
        name = relative.parent.name if relative.name == "__init__" else relative.name
        if name not in PACKAGES and f"`{name}" not in doc:
            missing.append(str(relative))
    assert not missing, f"docs/architecture.md does not describe {missing}"
    for word in ("Glossary", "role sample", "trace replay", "re-run", "recovery", "state(t)"):
        assert word in doc


#: A repository path in prose or a script: ``trainer_client/…``, ``env_server/…`` or their tests'
#: ``tests/…`` twins, up to the first character that cannot be in one (``::test`` selectors end it).
_REPO_PATH = re.compile(r"(?<![\w/.-])((?:tests/)?(?:trainer_client|env_server)/[\w./*<>{}-]*)")


def _named_repository_paths() -> dict[str, list[str]]:
    """``{path: [where it is named]}`` for every ``trainer_client/…`` or ``env_server/…`` path that
    the README, the docs (every page, the experiment records' pages and mkdocs.yml) and scripts/
    name; paths with a placeholder (``<package>``, ``*``, ``{…}``) are patterns, not paths."""
    texts = [ROOT / "README.md", ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted(p for p in (ROOT / "scripts").rglob("*") if p.is_file() and p.suffix in {".sh", ".py", ".md"})]
    named: dict[str, list[str]] = {}
    for path in texts:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for match in _REPO_PATH.finditer(line):
                name = match.group(1).rstrip(".")
                if not any(c in name for c in "*<>{}"):
                    named.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{n}")
    return named


def test_every_repository_path_named_in_the_docs_scripts_and_readme_exists() -> None:
    named = _named_repository_paths()
    # the walk finds the paths it is for (a renamed package would leave these behind)
    assert {"trainer_client/tiny_models/pinned/", "trainer_client/training/checkpoints.py"} & set(named)
    assert len(named) >= 20
    missing = {name: where for name, where in named.items() if not (ROOT / name).exists()}
    assert not missing, f"named but not in the repository: {missing}"


def test_the_path_walk_reports_a_path_that_is_gone(tmp_path: Path) -> None:
    """A line naming a moved module is caught (the regex ends the path at ``::`` and at a backtick)."""
    line = "see `trainer_client/experiments/train.py` and tests/trainer_client/training/test_checkpoints.py::test_x"
    found = [m.group(1) for m in _REPO_PATH.finditer(line)]
    assert found == ["trainer_client/experiments/train.py", "tests/trainer_client/training/test_checkpoints.py"]
    assert not (ROOT / found[0]).exists() and (ROOT / found[1]).exists()
