"""Names of a package that load on first use (PEP 562), so that importing the package
imports none of the modules behind them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, modules: Mapping[str, tuple[str, ...]], namespace: dict[str, Any],
               extras: Mapping[str, str] | None = None, submodules: Mapping[str, str] | None = None,
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of *package* (its ``__name__``) for *modules*: each
    submodule (relative to the package) and the names it defines. A name, once loaded, is
    stored in *namespace* (the package's ``globals()``) so later lookups cost nothing.
    *extras* maps a submodule to the pip extra that brings what it imports, for the error;
    *submodules* maps a name to a submodule that is itself the value (``sf.ray``)."""
    where = {name: module for module, names in modules.items() for name in names}
    whole = dict(submodules or {})
    hints = dict(extras or {})

    def __getattr__(name: str) -> Any:
        if name in whole:
            value = namespace[name] = importlib.import_module(f".{whole[name]}", package)
            return value
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            mod = importlib.import_module(f".{module}", package)
        except ImportError as exc:
            extra = hints.get(module)
            if extra is None:
                raise
            hint = f"pip install 'shardfeed[{extra}]'"
            raise ImportError(f"{package}.{name} needs the {extra} extras: {hint} ({exc})") from exc
        value = getattr(mod, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where) | set(whole))

    return __getattr__, __dir__
