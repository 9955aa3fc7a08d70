"""Save and load a model: its config as JSON beside its state dict (loaded with weights_only=True)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mnar_recsys.data.files import sha256_of
from mnar_recsys.io import atomic_path, provenance, write_json
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.training import distributed
from mnar_recsys.training.trainer import non_finite_parameter

CONFIG_FILE, STATE_FILE = "config.json", "state.pt"
DIGESTS_KEY = "sha256"  # config.json's record of the files saved with it
PROVENANCE_KEY = "provenance"  # the package version and commit that saved it


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
    write_json(directory / CONFIG_FILE, {"model": config.to_dict(), **(extra or {}), DIGESTS_KEY: digests,
                                         PROVENANCE_KEY: provenance()})
    return directory


def load(directory: str | Path, map_location: str = "cpu") -> tuple[NotMIWAE, ModelConfig, dict]:
    """Rebuild a saved model; return it, its config and the rest of config.json.

    config.json must record the sha256 of state.pt (a save that lacks it cannot be told from a damaged one),
    and every weight must be finite: NaN weights would give NaN predictions without a word."""
    directory = Path(directory)
    for name in (CONFIG_FILE, STATE_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} is missing: not a saved model directory")
    path = directory / CONFIG_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}): not a saved model, or a damaged one") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("model"), dict)
            and isinstance(meta.get(DIGESTS_KEY), dict) and isinstance(meta[DIGESTS_KEY].get(STATE_FILE), str)):
        raise ValueError(f"{path}: expected an object with a 'model' config object and a '{DIGESTS_KEY}' object "
                         f"holding the digest of {STATE_FILE}: not a saved model, or a damaged one")
    for name, digest in meta.pop(DIGESTS_KEY).items():
        if not (directory / name).is_file() or sha256_of(directory / name) != digest:
            raise ValueError(f"{directory / name} is not the file {path} was saved with (its sha256 "
                             "differs): a save into this folder was interrupted; save the model again")
    config = config_from(ModelConfig, meta.pop("model"), path, meta.get(PROVENANCE_KEY))
    model = build_model(config)
    try:  # read onto the CPU here, so that only the file's own faults are reported as the file's
        model.load_state_dict(torch.load(directory / STATE_FILE, map_location="cpu", weights_only=True))
    except Exception as error:  # torch's zip reader, unpickler and key checks each raise their own kind
        raise ValueError(f"{directory / STATE_FILE} does not hold the weights of the model {path} describes: "
                         f"{error}") from error
    bad = non_finite_parameter(model)
    if bad is not None:
        raise ValueError(f"{directory / STATE_FILE}: {bad}; the model it holds diverged, train it again")
    return model.to(map_location).eval(), config, meta


def config_from(config_type: type, fields: dict[str, Any], path: Path, saved_by: Any = None) -> Any:
    """`config_type(**fields)`, or a ValueError naming `path` and the package version that saved it when this
    version cannot rebuild it (a field it does not know, a value it refuses)."""
    try:
        return config_type(**fields)
    except (TypeError, ValueError) as error:  # a field it does not know, or a value it refuses
        version = saved_by.get("package_version") if isinstance(saved_by, dict) else None
        raise ValueError(f"{path}: this version of mnar_recsys cannot rebuild its {config_type.__name__} ({error}); "
                         f"it was saved by {'version ' + str(version) if version else 'an unknown version'}") \
            from None
