"""Results tables: mean ± spread cells and markdown tables."""

from __future__ import annotations

import numpy as np


def summarise(values: list[float], error: str = "sd") -> str:
    """'mean ± sd' (or ± standard error) of a list of numbers."""
    array = np.asarray(values, dtype=float)
    if array.size < 2:
        return f"{array.mean():.3f}"
    spread = array.std(ddof=1)
    if error == "se":
        spread /= np.sqrt(array.size)
    return f"{array.mean():.3f} ± {spread:.3f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
