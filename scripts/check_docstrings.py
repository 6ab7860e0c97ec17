"""Fail when a public name of a documented module has no docstring of its own.

The modules checked are the ones the API reference renders: every ``::: module`` line in
``docs/reference/*.md`` (a ``::: module.function`` line checks that function). A
module's public names are its ``__all__``; a module without
``__all__`` (``shardfeed.errors``) is taken to export the public classes and functions it
defines. Data (constants such as ``AUTOTUNE``) needs a docstring in the source, a string
literal right after the assignment, which griffe reads as the reference does.

Usage: ``python scripts/check_docstrings.py`` (exit 1 and one line per missing docstring).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
_DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.MULTILINE)


def documented_modules(reference: Path = REFERENCE) -> list[str]:
    """The module paths named by ``::: module`` directives in the reference pages, in order."""
    names: list[str] = []
    for page in sorted(reference.glob("*.md")):
        for name in _DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            if name not in names:
                names.append(name)
    return names


def _own_doc(obj: object) -> str:
    """The docstring ``obj`` itself carries: not one inherited, not one generated for it."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        # dataclasses and namedtuples write "Name(field, ...)" when the class has none
        if re.fullmatch(rf"{re.escape(obj.__name__)}\(.*\)", doc.strip(), re.DOTALL):
            return ""
        return doc.strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def public_names(module) -> list[str]:
    """``module.__all__``, or the public classes and functions defined in ``module``."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [name for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
            and getattr(obj, "__module__", None) == module.__name__]


def missing_docstrings(modules: list[str]) -> list[str]:
    """``module.name`` for every documented module or public name with no docstring."""
    missing: list[str] = []
    data: list[tuple[str, str]] = []
    for modname in modules:
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError:
            # "::: package.module.function": a function a page names on its own
            parent, _, name = modname.rpartition(".")
            if not _own_doc(getattr(importlib.import_module(parent), name)):
                missing.append(modname)
            continue
        if not _own_doc(module):
            missing.append(f"{modname} (module)")
        for name in public_names(module):
            if name.startswith("__"):  # __version__
                continue
            try:
                obj = getattr(module, name)
            except AttributeError:
                obj = importlib.import_module(f"{modname}.{name}")  # a submodule in __all__
            if not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)):
                data.append((modname, name))  # constants: their docstring is in the source
                continue
            if not _own_doc(obj):
                missing.append(f"{modname}.{name}")
    return missing + _missing_attribute_docstrings(data)


def _missing_attribute_docstrings(names: list[tuple[str, str]]) -> list[str]:
    """Data names with no docstring (a string literal right after the assignment), read
    statically with griffe, as the reference renders them; skipped without griffe."""
    try:
        import griffe  # noqa: PLC0415  (the docs extra)
    except ImportError:
        print("check_docstrings: griffe not installed (pip install '.[docs]'): constants not checked",
              file=sys.stderr)
        return []
    import shardfeed  # noqa: PLC0415

    pkg = griffe.load("shardfeed", search_paths=[str(Path(shardfeed.__file__).parent.parent)],
                      resolve_aliases=True, resolve_external=False)
    missing = []
    for modname, name in names:
        path = f"{modname}.{name}"[len("shardfeed."):]
        try:
            obj = pkg[path]
            doc = obj.final_target.docstring if obj.is_alias else obj.docstring
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            doc = None
        if doc is None or not doc.value.strip():
            missing.append(f"{modname}.{name}")
    return missing


def main() -> int:
    modules = documented_modules()
    if not modules:
        print(f"check_docstrings: no '::: module' lines under {REFERENCE}", file=sys.stderr)
        return 1
    missing = missing_docstrings(modules)
    for name in missing:
        print(f"no docstring: {name}", file=sys.stderr)
    print(f"check_docstrings: {len(modules)} reference entries, {len(missing)} missing docstrings")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
