"""Griffe extension for the API reference: turn the reStructuredText in shardfeed's
docstrings into the Markdown mkdocstrings renders.

- ``:class:`~shardfeed.errors.CorruptRecordError``` (and ``:func:``, ``:meth:``,
  ``:mod:``, ``:attr:``, ``:exc:``, ``:data:``, ``:obj:``) becomes a cross-reference when
  its target is rendered on some reference page, and plain code otherwise (a private
  helper, a module no page shows). Targets resolve as Sphinx would: a full path, a name
  in the docstring's scope, or ``.sibling`` relative to the module.
  A target that names nothing at all (a typo, a renamed function) is a warning, so
  ``mkdocs build --strict`` fails on it.
- A paragraph ending in ``::`` ends in ``:`` (its indented block is already Markdown code).

Names that static analysis cannot see are added before rendering: a package's lazy
``__getattr__`` names (``sf.read_table``) and a name that the import of a function
shadows (``sf.mix``, the function, not the module ``shardfeed.pipeline.mix``) become
aliases of the runtime object. Where the shadowed module is the package's own submodule
(``shardfeed.pipeline.mix``), the page names the function with its own ``:::`` line; a
name in ``__all__`` that no page renders is a warning.

"Rendered" means: every module named by a ``::: module`` line in ``docs/reference/*.md``,
its public members (``__all__``) and their public members. Each reference goes to one
rendered path (the top-level ``shardfeed.X`` first), so autorefs never sees two
candidates for one target.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import re
from pathlib import Path
from typing import Any

import griffe

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference"
_DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj):`(~?)([^`<>]+?)(?:\(\))?`")
# a "mkdocs." logger: under --strict its warnings fail the build
log = logging.getLogger("mkdocs.plugins.griffe_rst_roles")
_LITERAL_BLOCK = re.compile(r"(\S)::[ \t]*$", re.MULTILINE)


def _documented_modules() -> list[str]:
    names: list[str] = []
    for page in sorted(REFERENCE.glob("*.md")):
        names += [n for n in _DIRECTIVE.findall(page.read_text(encoding="utf-8")) if n not in names]
    # the top-level page first: a reference to Dataset goes to shardfeed.Dataset
    return sorted(names, key=lambda n: n != "shardfeed")


def _canonical(obj: Any) -> str | None:
    try:
        return obj.canonical_path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _public(obj: Any) -> bool:
    """Rendered by mkdocstrings: public, documented, not a submodule (each has its own page)."""
    try:
        return (obj.is_public and not obj.name.startswith("_") and not obj.is_module
                and (obj.docstring is not None or obj.is_class))
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False


def _rendered_paths(pkg: griffe.Module) -> dict[str, str]:
    """Every path a reference may name (rendered or canonical) -> the rendered path."""
    rendered: dict[str, str] = {}

    def add(path: str, obj: Any) -> None:
        rendered.setdefault(path, path)
        canonical = _canonical(obj)
        if canonical:
            rendered.setdefault(canonical, path)

    for modpath in _documented_modules():
        if modpath != pkg.path and not modpath.startswith(pkg.path + "."):
            continue
        module = pkg if modpath == pkg.path else pkg[modpath[len(pkg.path) + 1:]]
        add(modpath, module)
        for name, member in module.members.items():
            if not _public(member):
                continue
            add(f"{modpath}.{name}", member)
            try:
                is_class = member.is_class
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            if is_class:
                for sub_name, sub in member.members.items():
                    if _public(sub):
                        add(f"{modpath}.{name}.{sub_name}", sub)
    return rendered


def _runtime_path(value: Any) -> str | None:
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else None


def _add_runtime_names(pkg: griffe.Module, directives: list[str]) -> None:
    """Alias the ``__all__`` names griffe misses (lazy, or shadowed by a module) to their
    runtime definitions; warn for one that still would not be rendered."""
    for modpath in directives:
        if modpath != pkg.path and not modpath.startswith(pkg.path + "."):
            continue
        try:
            runtime = importlib.import_module(modpath)
        except ImportError:
            continue  # a "::: module.function" line, or a module needing an absent extra
        module = pkg if modpath == pkg.path else pkg[modpath[len(pkg.path) + 1:]]
        for name in getattr(runtime, "__all__", ()):
            if name.startswith("__"):
                continue
            value = getattr(runtime, name)
            if inspect.ismodule(value):
                continue
            member = module.members.get(name)
            if member is not None and not (member.is_alias and member.is_module) and not member.is_module:
                continue
            target = _runtime_path(value)
            if member is not None and not member.is_alias:
                # the package's own submodule: it must stay, so a page renders the function
                if target not in directives:
                    log.warning("%s: %r in __all__ is %s, but static analysis sees the submodule %s: "
                                "add '::: %s' to a page under docs/reference/",
                                modpath, name, target, member.path, target)
                continue
            if target is None or target.partition(".")[0] != pkg.path:
                log.warning("%s.%s (in __all__) cannot be rendered: no definition found", modpath, name)
                continue
            module.set_member(name, griffe.Alias(name, target, parent=module))


def _candidates(obj: Any, target: str) -> list[str]:
    module = obj.module
    if target.startswith("shardfeed."):
        return [target]
    if target.startswith("."):
        out = [module.path + target]
        if module.parent is not None:
            out.append(module.parent.path + target)
        return out
    head, _, rest = target.partition(".")
    out = []
    for scope in (obj, obj.parent, module):
        if scope is None:
            continue
        try:
            resolved = scope.resolve(head)
        except (griffe.NameResolutionError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        out.append(f"{resolved}.{rest}" if rest else resolved)
    for scope in (obj, obj.parent, module, module.parent):
        if scope is not None:
            out.append(f"{scope.path}.{target}")
    out.append(f"shardfeed.{target}")
    return out


def _external(target: str) -> bool:
    """A name in another package (``concurrent.futures.Future``): not ours to check."""
    head = target.partition(".")[0]
    return "." in target and head not in ("", "shardfeed") and importlib.util.find_spec(head) is not None


class RstToMarkdown(griffe.Extension):
    """Rewrite RST roles and literal-block markers in every shardfeed docstring."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != "shardfeed":
            return
        _add_runtime_names(pkg, _documented_modules())
        rendered = _rendered_paths(pkg)
        collection = loader.modules_collection

        def exists(path: str) -> bool:
            try:
                collection.get_member(path)
            except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                return False
            return True

        def rewrite(obj: Any) -> None:
            if obj.docstring is not None:
                def link(match: re.Match) -> str:
                    short, target = match.group(1), match.group(2).strip()
                    shown = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
                    candidates = _candidates(obj, target)
                    for candidate in candidates:
                        if candidate in rendered:
                            return f"[`{shown}`][{rendered[candidate]}]"
                    if not any(exists(c) for c in candidates) and not _external(target):
                        where = obj.docstring.lineno if obj.docstring.lineno else "?"
                        log.warning("%s:%s (%s): %s names nothing in shardfeed",
                                    obj.relative_filepath, where, obj.path, match.group(0))
                    return f"`{shown}`"

                text = _ROLE.sub(link, obj.docstring.value)
                obj.docstring.value = _LITERAL_BLOCK.sub(r"\1:", text)
            for member in obj.members.values():
                if not member.is_alias:
                    rewrite(member)

        rewrite(pkg)
