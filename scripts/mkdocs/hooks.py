"""MkDocs hooks of the docs site (``mkdocs.yml``: ``hooks:``): pages made at build time.

- ``rfcs/*.md`` and ``benchmarks/README.md`` join the site from where they live in the
  repository (they link only to each other), so the site never holds a stale copy.
- ``reference/<package>.md``: one API page per package of ``env_server`` and ``trainer_client``,
  each a ``::: module`` block per module, rendered by mkdocstrings from the docstrings.
- ``configuration.md``: the marker ``<!-- trainconfig-reference -->`` becomes the reference of
  every ``TrainConfig`` field, nested sections included, read from the pydantic models (type,
  constraints, default) and their docstrings' Attributes (description). A field without a
  description is a warning, so ``mkdocs build --strict`` fails until it is documented.

Hooks rather than a plugin (mkdocs-gen-files, mkdocs-macros): three small jobs, each a few lines
against MkDocs' own ``File.generated``, with no further dependency.
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import griffe
from mkdocs.structure.files import File, Files
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from griffe_docstrings import rewrite_docstring  # noqa: E402  (this folder is not a package)

log = logging.getLogger("mkdocs.hooks.mathdebate")

CONFIG_MARKER = "<!-- trainconfig-reference -->"
PACKAGES = ("env_server", "trainer_client", "math_debate")
#: Modules that only re-export names (none since the documented paths are where names are defined).
REEXPORTS: set[str] = set()


# --- pages that live elsewhere in the repository -----------------------------------------------

def _repository_pages() -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / "rfcs").glob("*.md")):
        yield f"rfcs/{path.name}", path
    yield "benchmarks/README.md", ROOT / "benchmarks" / "README.md"


# --- API reference -------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def api_pages() -> dict[str, list[str]]:
    """``{page name: [module, ...]}``: the root modules of each package on one page, then one page
    per subpackage with every module under it (``env_server.debate`` holds ``debate.problems``)."""
    pages: dict[str, list[str]] = {}
    for package in PACKAGES:
        base = ROOT / package
        roots = sorted(_module_name(p) for p in base.glob("*.py") if p.name != "__init__.py")
        pages[package] = [package, *(m for m in roots if m not in REEXPORTS)]
        for sub in sorted(p for p in base.iterdir() if (p / "__init__.py").exists()):
            name = f"{package}.{sub.name}"
            pages[name] = [name, *sorted(_module_name(p) for p in sub.rglob("*.py") if _module_name(p) != name)]
    return pages


def _api_markdown(page: str, modules: list[str]) -> str:
    lines = [f"# `{page}`", "",
             "Generated from the docstrings at build time (mkdocstrings). The package map and the import "
             "rules are in [Architecture](../architecture.md).", ""]
    for module in modules:
        lines += [f"::: {module}", ""]
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    """Add the RFCs, the benchmarks' README and the API pages to the site's files."""
    for uri, path in _repository_pages():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    for page, modules in api_pages().items():
        files.append(File.generated(config, f"reference/{page}.md", content=_api_markdown(page, modules)))
    return files


# --- configuration reference ----------------------------------------------------------------------

@dataclass
class _Section:
    model: type[BaseModel]
    prefixes: list[str] = field(default_factory=list)


def _nested_models(annotation: Any, in_list: bool = False) -> Iterator[tuple[type[BaseModel], bool]]:
    """The pydantic models an annotation holds, each with whether it sits in a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, in_list
        return
    origin = typing.get_origin(annotation)
    if origin is dict:
        return  # free-form mappings (``params``) are not sections
    for arg in typing.get_args(annotation):
        yield from _nested_models(arg, in_list or origin is list)


def config_sections(root: type[BaseModel]) -> list[_Section]:
    """Every model reachable from ``root`` through its fields, in field order, each with the
    dotted paths it sits at (``replay.teachers[]`` for the entries of a list)."""
    sections: dict[type[BaseModel], _Section] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        sections.setdefault(model, _Section(model)).prefixes.append(prefix)
        for name, info in model.model_fields.items():
            path = f"{prefix}.{name}" if prefix else name
            for sub, in_list in _nested_models(info.annotation):
                walk(sub, path + ("[]" if in_list else ""))

    walk(root, "")
    return list(sections.values())


def _descriptions(model: type[BaseModel]) -> dict[str, str]:
    """The model's Attributes entries (its docstring as the API pages read it)."""
    doc = griffe.Docstring(rewrite_docstring(inspect.getdoc(model) or ""), parser="google",
                           parser_options={"warn_missing_types": False, "warn_unknown_params": False})
    out = {}
    for section in doc.parsed:
        if section.kind is griffe.DocstringSectionKind.attributes:
            for item in section.value:
                out[item.name] = " ".join(item.description.split())
    return out


def _type_text(annotation: Any, anchors: dict[type[BaseModel], str]) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[section](#{anchors[annotation]})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_text(a, anchors) for a in args)
    if origin is list:
        return f"list of {_type_text(args[0], anchors)}" if args else "list"
    if origin is dict:
        return "mapping"
    if annotation is Any:
        return "any"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _default_text(info: Any) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "its defaults"
    return f"`{json.dumps(_plain(value))}`"


def _constraints(info: Any) -> str:
    marks = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    found = []
    for meta in info.metadata:
        for attr, mark in marks.items():
            if getattr(meta, attr, None) is not None:
                found.append(f"{mark} {getattr(meta, attr)}")
    return ", ".join(found)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference(root: type[BaseModel] | None = None) -> str:
    """The Markdown of the configuration reference: one table per section."""
    if root is None:
        from trainer_client.config import TrainConfig

        root = TrainConfig
    sections = config_sections(root)
    anchors = {s.model: "cfg-" + s.model.__name__.lower() for s in sections}
    out = []
    for section in sections:
        where = ", ".join(f"`{p}`" for p in section.prefixes) if section.prefixes != [""] else "top level"
        out += [f"### {where} {{ #{anchors[section.model]} }}", "",
                f"`{section.model.__module__}.{section.model.__name__}`", "",
                "| key | type | default | description |", "|---|---|---|---|"]
        described = _descriptions(section.model)
        for name, info in section.model.model_fields.items():
            description = info.description or described.get(name, "")
            if not description:
                log.warning("configuration reference: %s.%s has no description (add it to the class "
                            "docstring's Attributes)", section.model.__name__, name)
            keys = "<br>".join(f"`{p}.{name}`" if p else f"`{name}`" for p in section.prefixes)
            kind = _type_text(info.annotation, anchors)
            limits = _constraints(info)
            out.append(f"| {keys} | {_cell(kind + (', ' + limits if limits else ''))} | {_cell(_default_text(info))} | "
                       f"{_cell(description)} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Put the configuration reference where its marker is."""
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    return markdown
