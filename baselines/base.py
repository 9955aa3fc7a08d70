"""The interface every rating predictor shares (cornac-style fit / predict, the protocol's ``Recommender``), and
what a results record keeps of a fitted one."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any

from mnar_recsys.evaluation.protocol import Recommender

__all__ = ["Recommender", "settings_of"]


def settings_of(model: Recommender) -> dict[str, Any]:
    """A fitted model's own configuration for a results record: what its ``settings()`` says where it has one
    (what its config alone leaves out, such as how its propensities were estimated), else its dataclass config."""
    settings = getattr(model, "settings", None)
    if callable(settings):
        return settings()
    config = getattr(model, "config", None)
    return asdict(config) if is_dataclass(config) else {}
