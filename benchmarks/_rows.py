"""Row strings for the table ``shardfeed bench`` prints.

Every benchmark script that ``shardfeed bench`` runs puts, in its JSON result, a top-level
``"rows"`` list of ``[configuration, shardfeed, anchor, ratio]`` strings computed from its
own results (a ``table_rows(result)`` function in the script); ``shardfeed bench`` only
prefixes the benchmark's name and prints them. These helpers keep the numbers in the same
shape across scripts.
"""

from __future__ import annotations

Row = tuple[str, str, str, str]  # configuration, shardfeed, anchor, ratio (JSON writes it as a list)


def rate(x: float, unit: str) -> str:
    """``x`` per second in ``unit``: no decimals from 100 up, two below."""
    return f"{x:,.0f} {unit}" if x >= 100 else f"{x:,.2f} {unit}"


def ratio(x: float | None) -> str:
    """shardfeed over the anchor as ``"1.23x"``; ``"-"`` when there is no anchor."""
    return "-" if x is None else f"{x:.2f}x"

