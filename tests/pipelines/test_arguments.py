"""Config dataclasses as command-line options: types, defaults, help and choices from the fields."""

import argparse
from dataclasses import dataclass

import pytest

from mnar_recsys.pipelines.arguments import add_config_options, config_from_options, option


@dataclass
class Toy:
    steps: int = option(10, "training steps")
    rate: float = option(0.5, "step size")
    device: str = option("auto", "where to run", ("auto", "cpu"))


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="toy")
    add_config_options(made, Toy)
    return made


def test_options_round_trip_to_the_config():
    assert config_from_options(parser().parse_args([]), Toy) == Toy()
    parsed = config_from_options(parser().parse_args(["--steps", "3", "--rate", "0.25", "--device", "cpu"]), Toy)
    assert parsed == Toy(steps=3, rate=0.25, device="cpu")


def test_help_gives_each_field_its_text_and_default():
    text = " ".join(parser().format_help().split())
    assert "--steps STEPS training steps (default: 10)" in text
    assert "--device {auto,cpu} where to run (default: auto)" in text


def test_choices_and_types_are_checked_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--device", "gpu"])
    assert "argument --device: invalid choice: 'gpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["--steps", "1.5"])
    assert "argument --steps: invalid int value: '1.5'" in capsys.readouterr().err
