"""Save and load a model: its config as JSON beside its state dict (loaded with weights_only=True)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mnar_recsys.evaluation.reports import atomic_path, write_json
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.training import distributed

CONFIG_FILE, STATE_FILE = "config.json", "state.pt"


def save(model: NotMIWAE, config: ModelConfig, directory: str | Path, extra: dict | None = None) -> Path:
    """Write config.json (the model config plus `extra`, e.g. the training config) and state.pt.

    In a data-parallel job only process 0 writes (every process holds the same parameters)."""
    directory = Path(directory)
    if not distributed.is_main_process():
        return directory
    with atomic_path(directory / STATE_FILE) as tmp:
        torch.save(model.state_dict(), tmp)
    write_json(directory / CONFIG_FILE, {"model": config.to_dict(), **(extra or {})})
    return directory


def load(directory: str | Path, map_location: str = "cpu") -> tuple[NotMIWAE, ModelConfig, dict]:
    """Rebuild a saved model; return it, its config and the rest of config.json."""
    directory = Path(directory)
    for name in (CONFIG_FILE, STATE_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} is missing: not a saved model directory")
    meta = json.loads((directory / CONFIG_FILE).read_text())
    config = ModelConfig(**meta.pop("model"))
    model = build_model(config)
    model.load_state_dict(torch.load(directory / STATE_FILE, map_location=map_location, weights_only=True))
    return model.eval(), config, meta
