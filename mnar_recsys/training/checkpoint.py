"""Save and load a model: its config as JSON beside its state dict (loaded with weights_only=True)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mnar_recsys.data.files import sha256_of
from mnar_recsys.evaluation.reports import atomic_path, write_json
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.training import distributed

CONFIG_FILE, STATE_FILE = "config.json", "state.pt"
DIGESTS_KEY = "sha256"  # config.json's record of the files saved with it


def save(model: NotMIWAE, config: ModelConfig, directory: str | Path, extra: dict | None = None,
         companions: tuple[str, ...] = ()) -> Path:
    """Write state.pt, then config.json (the model config plus `extra`, e.g. the training config).

    config.json, written last, records the sha256 of state.pt and of the `companions`, files the caller
    has already written into `directory`; `load` checks them, so a save interrupted while overwriting an
    earlier one is refused rather than read as a mix of the two. In a data-parallel job only process 0
    writes (every process holds the same parameters)."""
    directory = Path(directory)
    if not distributed.is_main_process():
        return directory
    with atomic_path(directory / STATE_FILE) as tmp:
        torch.save(model.state_dict(), tmp)
    digests = {name: sha256_of(directory / name) for name in (STATE_FILE, *companions)}
    write_json(directory / CONFIG_FILE, {"model": config.to_dict(), **(extra or {}), DIGESTS_KEY: digests})
    return directory


def load(directory: str | Path, map_location: str = "cpu") -> tuple[NotMIWAE, ModelConfig, dict]:
    """Rebuild a saved model; return it, its config and the rest of config.json."""
    directory = Path(directory)
    for name in (CONFIG_FILE, STATE_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} is missing: not a saved model directory")
    meta = json.loads((directory / CONFIG_FILE).read_text())
    for name, digest in meta.pop(DIGESTS_KEY, {}).items():
        path = directory / name
        if not path.is_file() or sha256_of(path) != digest:
            raise ValueError(f"{path} is not the file {directory / CONFIG_FILE} was saved with (its sha256 "
                             "differs): a save into this folder was interrupted; save the model again")
    config = ModelConfig(**meta.pop("model"))
    model = build_model(config)
    model.load_state_dict(torch.load(directory / STATE_FILE, map_location=map_location, weights_only=True))
    return model.eval(), config, meta
