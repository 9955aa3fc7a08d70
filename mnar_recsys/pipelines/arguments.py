"""A flat config dataclass as command-line options, and back."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import TypeVar

Config = TypeVar("Config")


def add_config_options(parser: argparse.ArgumentParser, config_type: type) -> None:
    """One option per field (`--field-name`), typed and defaulted from the dataclass's defaults."""
    for field, value in asdict(config_type()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)


def config_from_options(args: argparse.Namespace, config_type: type[Config]) -> Config:
    return config_type(**{field: getattr(args, field) for field in asdict(config_type())})
