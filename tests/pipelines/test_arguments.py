"""Config dataclasses as command-line options: types, defaults, help and choices from the fields."""

import argparse
from dataclasses import dataclass

import pytest

from mnar_recsys.pipelines.arguments import (
    add_config_options,
    check_choices,
    config_from_options,
    integers,
    naming_options,
    option,
)


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


@dataclass
class Listed:
    seeds: tuple[int, ...] | None = option(None, "comma-separated seeds", parse=integers, shown_default="every seed")
    quiet: bool = option(False, "say nothing")
    size: int = option(3, "a size, 5% or less", metavar="N")
    mode: str = option("a", "a mode", ("a", "b"))


def listed_parser(skip: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="listed")
    add_config_options(made, Listed, skip=skip)
    return made


def test_a_field_can_parse_its_own_text_be_a_flag_and_say_what_its_default_means():
    assert config_from_options(listed_parser().parse_args([]), Listed) == Listed()
    parsed = config_from_options(listed_parser().parse_args(["--seeds", "1,2", "--quiet", "--size", "4"]), Listed)
    assert parsed == Listed(seeds=(1, 2), quiet=True, size=4)
    text = " ".join(listed_parser().format_help().split())
    assert "--seeds SEEDS comma-separated seeds (default: every seed)" in text
    assert "--size N a size, 5% or less (default: 3)" in text and "--quiet say nothing" in text


def test_skipped_fields_are_no_options_and_are_given_instead(capsys):
    with pytest.raises(SystemExit):
        listed_parser(skip=("quiet",)).parse_args(["--quiet"])
    assert "unrecognized arguments: --quiet" in capsys.readouterr().err
    args = listed_parser(skip=("quiet",)).parse_args(["--mode", "b"])
    assert config_from_options(args, Listed, skip=("quiet",), quiet=True) == Listed(quiet=True, mode="b")


def test_a_config_made_in_python_is_held_to_its_options_choices():
    check_choices(Listed(mode="b"))
    with pytest.raises(ValueError, match=r"^--mode must be one of a, b, got 'c'$"):
        check_choices(Listed(mode="c"))


def test_a_lower_configs_refusal_names_the_option_that_set_the_value():
    with pytest.raises(ValueError, match=r"^--importance-samples must be a positive integer, got 0$"):
        with naming_options({"n_samples": "importance_samples"}):
            raise ValueError("n_samples must be a positive integer, got 0")
    with pytest.raises(ValueError, match=r"^n_samples_total is not a field named$"):  # others pass as they were
        with naming_options({"n_samples": "importance_samples"}):
            raise ValueError("n_samples_total is not a field named")
