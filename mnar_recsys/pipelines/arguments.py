"""A flat config dataclass as command-line options, and back."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, field, fields
from pathlib import Path
from typing import Any, TypeVar

from mnar_recsys.devices import check_device_name

Config = TypeVar("Config")


def option(default: Any, help: str, choices: tuple[Any, ...] | None = None) -> Any:
    """A config field with the help (and the choices, if any) of its command-line option."""
    return field(default=default, metadata={"help": help, "choices": choices})


def add_config_options(parser: argparse.ArgumentParser, config_type: type) -> None:
    """One option per field (`--field-name`), typed and defaulted from the dataclass's defaults, with the
    help and choices its `option` gives."""
    for spec in fields(config_type):
        default = spec.default
        parser.add_argument(f"--{spec.name.replace('_', '-')}", type=type(default), default=default,
                            choices=spec.metadata["choices"], help=f"{spec.metadata['help']} (default: {default})")


def check_counts(config: object, least: dict[str, int]) -> None:
    """Refuse a count below its least value as the config is made, before any data is read or any model
    trained, naming its command-line option."""
    for name, bound in least.items():
        value = getattr(config, name)
        if value < bound:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {bound}, got {value}")


MAX_SEED = 2**32 - 1  # the largest seed NumPy's legacy generator takes, as scikit-learn and implicit seed it
TORCH_MAX_SEED = 2**64 - 1  # the largest torch.manual_seed takes (NumPy's Generator takes any)


def check_seeds(label: str, seeds: tuple[int, ...] | list[int], most: int = MAX_SEED) -> None:
    """Refuse a seed outside 0..`most`, naming its option, before an earlier run's files are touched."""
    bad = [s for s in seeds if not 0 <= s <= most]
    if bad:
        raise ValueError(f"{label} must lie in 0..{most}, got {', '.join(map(str, bad))}")


def check_output_folder(out: str | Path) -> None:
    """Refuse an --out that cannot become a results folder before anything runs: empty, an existing file, or
    a path whose nearest existing folder is a file or cannot be written (training would be lost)."""
    if str(out) == "":
        raise ValueError("--out is empty: name the results folder")
    path = Path(out).absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out} lies under {existing}, a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {existing} cannot be written to")


def check_no_repeats(label: str, values: tuple | list) -> None:
    """Refuse an option that names a value twice: each would run again and count as another run."""
    repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
    if repeated:
        raise ValueError(f"{label} names {', '.join(map(str, repeated))} more than once")


def check_device_option(name: str) -> None:
    """Refuse a device name that no machine has, as the config is made, naming `--device`."""
    try:
        check_device_name(name)
    except ValueError as error:
        raise ValueError(f"--{error}") from None


def config_from_options(args: argparse.Namespace, config_type: type[Config]) -> Config:
    return config_type(**{name: getattr(args, name) for name in asdict(config_type())})
