"""A flat config dataclass as command-line options, and back."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import field, fields
from pathlib import Path
from typing import Any, TypeVar

from mnar_recsys.devices import check_device_name

Config = TypeVar("Config")


def option(default: Any, help: str, choices: tuple[Any, ...] | None = None, *,
           parse: Callable[[str], Any] | None = None, shown_default: str | None = None,
           metavar: str | None = None) -> Any:
    """A config field with the help (and the choices, if any) of its command-line option. `parse` reads the
    option's text (default: the default's type; a False default makes a flag); `shown_default` says what the
    default means where its value would not (None: the protocol's)."""
    return field(default=default, metadata={"help": help, "choices": choices, "parse": parse,
                                            "shown_default": shown_default, "metavar": metavar})


def add_config_options(parser: argparse.ArgumentParser, config_type: type, skip: tuple[str, ...] = ()) -> None:
    """One option per field (`--field-name`) but those in `skip`, typed and defaulted from the dataclass's
    defaults, with the help and choices its `option` gives."""
    for spec in fields(config_type):
        if spec.name in skip:
            continue
        default, meta = spec.default, spec.metadata
        shown = meta.get("shown_default") or default
        help = f"{meta['help']} (default: {shown})".replace("%", "%%")  # argparse formats help with %
        name = f"--{spec.name.replace('_', '-')}"
        if default is False and meta.get("parse") is None:
            parser.add_argument(name, action="store_true", help=help)
            continue
        parser.add_argument(name, type=meta.get("parse") or type(default), default=default,
                            choices=meta["choices"], metavar=meta.get("metavar"), help=help)


def integers(text: str) -> tuple[int, ...]:
    """Comma-separated integers; an empty item ('0,,1') is refused rather than dropped: the list may not be
    what was meant."""
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def names(text: str) -> tuple[str, ...]:
    """Comma-separated names; none at all is refused (an empty list would quietly run a default)."""
    listed = tuple(v.strip() for v in text.split(",") if v.strip())
    if not listed:
        raise argparse.ArgumentTypeError(f"expected comma-separated model names, got {text!r}")
    return listed


def check_choices(config: object) -> None:
    """Refuse a field outside the choices its `option` gives, naming its command-line option: a config made
    in Python passes no parser."""
    for spec in fields(config):
        allowed, value = spec.metadata.get("choices"), getattr(config, spec.name)
        if allowed is not None and value not in allowed:
            raise ValueError(f"--{spec.name.replace('_', '-')} must be one of {', '.join(map(str, allowed))}, "
                             f"got {value!r}")


@contextmanager
def naming_options(options: dict[str, str]) -> Iterator[None]:
    """Re-raise a ValueError of a lower config (TrainConfig, ModelConfig...) that names one of its fields
    (the keys of `options`) as naming the command-line option of the value instead (`options`' values,
    config fields of the pipeline), so that its checks are not repeated to name the option."""
    try:
        yield
    except ValueError as error:
        text = str(error)
        named = next((name for name in options if text.startswith(f"{name} ")), None)
        if named is None:
            raise
        raise ValueError(f"--{options[named].replace('_', '-')}{text[len(named):]}") from None


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


def config_from_options(args: argparse.Namespace, config_type: type[Config], skip: tuple[str, ...] = (),
                        **given: Any) -> Config:
    """The config the options of `add_config_options` (less `skip`) parsed, with the fields `given` here."""
    return config_type(**{spec.name: getattr(args, spec.name) for spec in fields(config_type) if spec.name not in skip},
                       **given)
