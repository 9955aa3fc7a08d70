"""What one `mnar-recsys ratings` run does (`RatingsRun`, whose fields are the command's options), the model
sets and protocols it names, and its checks, made as the run is configured, before any work.

The values that `TrainConfig`, `ImportanceConfig` and `ModelConfig` check are checked by building those
configs, their errors naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baselines.registry import BASELINES, GRIDS, SPECS
from mnar_recsys.data.simulator import SELECTIONS
from mnar_recsys.estimators.recommender import PUBLISHED, VARIANTS, RecommenderConfig
from mnar_recsys.inference.importance import ImportanceConfig
from mnar_recsys.pipelines.arguments import (
    check_choices,
    check_counts,
    check_device_option,
    check_no_repeats,
    check_output_folder,
    check_seeds,
    integers,
    names,
    naming_options,
    option,
)
from mnar_recsys.pipelines.ratings_data import simulator_config
from mnar_recsys.training.trainer import TrainConfig

DATASETS = ("synthetic", "coat", "yahoo")
DEFAULT_MODELS = ("notmiwae-gaussian", "notmiwae-categorical", "notmiwae-categorical-activity", "miwae-gaussian", "mf",
                  "pmf", "autorec", "mf-ips", "train-mean", "constant-2")
MODEL_SETS = ("default", "paper")
# what the not-MIWAE models train with, and the seeds, by protocol: "quick" shows the paper's effect in minutes,
# "paper" takes the paper's Yahoo! R3 steps (10,000 of Adam at 1e-3) over 5 seeds; both keep the best iteration
# on the held-out users unless --validation-fraction 0 (the paper's fixed length) and predict with K = 1,000
PROTOCOLS: dict[str, dict[str, Any]] = {"quick": {"iterations": 2_000, "lr": 3e-3, "seeds": (0,)},
                                        "paper": {"iterations": 10_000, "lr": 1e-3, "seeds": (0, 1, 2, 3, 4)}}
SYNTHETIC_ONLY = ("users", "items", "test_users", "data_seed", "selection")  # RatingsRun fields of the simulator
# Smaller than Yahoo! R3 (15,400 x 1,000) so that the default run takes minutes on a CPU; the logistic
# selection needs 404 items or more to reach Yahoo! R3's train shares with its per-user counts
SYNTHETIC_USERS, SYNTHETIC_ITEMS = 2_000, 500
# the fields of the configs below that the run sets, by the run's field (its option) that sets them
TRAIN_OPTIONS = {name: name for name in ("iterations", "batch_size", "lr", "validation_fraction")}
IMPORTANCE_OPTIONS = {"n_samples": "importance_samples"}
MODEL_OPTIONS = {"unobserved_samples": "unobserved_samples"}


def _protocol_help(name: str) -> str:
    settings = PROTOCOLS[name]
    return (f"{settings['iterations']:,} iterations at lr {settings['lr']:g}, seeds "
            f"{','.join(map(str, settings['seeds']))}")


@dataclass
class RatingsRun:
    """What one `ratings` run does; each field is the command-line option of its name (`--data-dir` for
    data_dir), whose help says what it means."""

    data: str = option("synthetic", "synthetic: the Yahoo-like simulator, which needs no files; coat or yahoo: "
                                    "their files in --data-dir", DATASETS)
    data_dir: str | None = option(None, "folder of the coat / yahoo files, none for synthetic", parse=str,
                                  shown_default="none")
    models: tuple[str, ...] = option(
        (), f"comma-separated, from {', '.join([*VARIANTS, *BASELINES, 'oracle'])}, or a model set: default, or "
            "paper (every row of the not-MIWAE paper's Yahoo! R3 table the package has)", parse=names,
        shown_default=f"{','.join(DEFAULT_MODELS)}, plus oracle on synthetic")
    protocol: str = option("quick", f"quick ({_protocol_help('quick')}) or paper ({_protocol_help('paper')}); "
                                    "--seeds, --iterations and --lr override it", tuple(PROTOCOLS))
    seeds: tuple[int, ...] | None = option(None, "comma-separated", parse=integers, shown_default="the protocol's")
    out: str = option("results/ratings", "output folder")
    iterations: int | None = option(None, "not-MIWAE training steps", parse=int, shown_default="the protocol's")
    batch_size: int = option(100, "users per not-MIWAE step, over all processes under torchrun; 100 is the "
                                  "paper's")
    lr: float | None = option(None, "not-MIWAE Adam step size", parse=float, shown_default="the protocol's")
    validation_fraction: float = option(0.1, "hold out this share of the train users and keep the not-MIWAE "
                                             "parameters with the best bound on them, no MCAR data used (0: the "
                                             "paper's fixed iterations)")
    importance_samples: int = option(1_000, "K for prediction by importance sampling (the paper: 10,000)",
                                     shown_default="1,000")
    device: str = option("auto", "auto (CUDA when torch sees a GPU), cpu, cuda or cuda:N")
    users: int = option(SYNTHETIC_USERS, "synthetic users (Yahoo! R3 has 15,400)")
    items: int = option(SYNTHETIC_ITEMS, "synthetic items (Yahoo! R3 has 1,000)")
    test_users: int | None = option(None, "synthetic users with 10 MCAR ratings", parse=int,
                                    shown_default="Yahoo's share, 5,400/15,400")
    data_seed: int = option(0, "seed of the synthetic data")
    selection: str = option(
        "logistic", "synthetic self-selection: logistic (a draw per cell in the rating, the item and the user's "
                    "activity, light users dropped, as datasets/synthetic describes), race (a fixed number of ratings "
                    "per user) or independent (a logistic draw per cell without the user's activity, the "
                    "not-MIWAE's own missing model)", SELECTIONS)
    unobserved_samples: int | None = option(
        None, "train the not-MIWAE models on the missing term estimated from M uniform draws of unobserved items "
              "per user instead of all of them (large catalogues; prediction stays exact)", parse=int,
        shown_default="the exact term", metavar="M")
    jobs: int = option(1, "worker processes, one thread each, that share the (seed, model) runs out (1: all here)")
    tune_baselines: bool = option(
        False, f"choose the hyper-parameters of {', '.join(GRIDS)} for each seed on 10% of its train ratings held "
               "out (IPS-weighted for the models trained with propensities), never on the scored MCAR ratings",
        shown_default="keep those chosen on Coat's train ratings")

    def __post_init__(self) -> None:
        check_choices(self)
        if self.data != "synthetic" and not self.data_dir:
            raise ValueError(f"--data {self.data} needs --data-dir")
        for name, value in PROTOCOLS[self.protocol].items():  # what is left unset, the protocol sets
            if getattr(self, name) is None:
                setattr(self, name, value)
        self._check_models()
        if self.data == "synthetic" and self.data_dir:
            raise ValueError("--data synthetic reads no files: leave out --data-dir, or choose --data coat or yahoo")
        if not self.seeds:
            raise ValueError("give at least one seed")
        check_seeds("--seeds", self.seeds)
        check_seeds("--data-seed", [self.data_seed])
        check_no_repeats("--seeds", self.seeds)
        check_output_folder(self.out)
        with naming_options(MODEL_OPTIONS):  # the not-MIWAE models' config, less their variant's architecture
            RecommenderConfig(model={"unobserved_samples": self.unobserved_samples}, train=self.train_config(),
                              importance=self.importance_config())
        check_counts(self, dict.fromkeys(("users", "items", "jobs"), 1))
        check_device_option(self.device)
        if self.test_users is not None and not 1 <= self.test_users <= self.users:
            raise ValueError(f"--test-users must lie in 1..{self.users} (--users), got {self.test_users}")
        if self.data != "synthetic":
            changed = [f"--{name.replace('_', '-')}" for name in SYNTHETIC_ONLY
                       if getattr(self, name) != RatingsRun.__dataclass_fields__[name].default]
            if changed:
                raise ValueError(f"{', '.join(changed)} set(s) the simulator, which --data {self.data} does not use")
        else:
            simulator_config(self)  # refused now, before any work, not when the data are drawn

    def _check_models(self) -> None:
        check_no_repeats("--models", self.models)
        self.models = expand_model_sets(self.models or ("default",), self.data)
        known = set(VARIANTS) | set(BASELINES) | {"oracle"}
        unknown = [m for m in self.models if m not in known]
        if unknown:
            raise ValueError(f"unknown models {unknown}; choose from {', '.join(sorted(known))}")
        if "oracle" in self.models and self.data != "synthetic":
            raise ValueError("the oracle is only known on --data synthetic")
        given = [m for m in self.models if m in SPECS and SPECS[m].given_propensities]
        if given and self.data != "coat":
            raise ValueError(f"{given[0]} takes the propensities Coat ships with: use it with --data coat")
        if self.tune_baselines and not set(GRIDS) & set(self.models):
            raise ValueError(f"--tune-baselines tunes {', '.join(GRIDS)}: add one of them to --models")

    def train_config(self, progress: bool = False) -> TrainConfig:
        """How the not-MIWAE models train; a value it refuses is named by its option."""
        with naming_options(TRAIN_OPTIONS):
            return TrainConfig(iterations=self.iterations, batch_size=self.batch_size, lr=self.lr, device=self.device,
                               progress=progress, validation_fraction=self.validation_fraction)

    def importance_config(self, progress: bool = False) -> ImportanceConfig:
        """How the not-MIWAE models predict; a value it refuses is named by its option."""
        with naming_options(IMPORTANCE_OPTIONS):
            return ImportanceConfig(n_samples=self.importance_samples, device=self.device, progress=progress)


def model_set(name: str, data: str) -> tuple[str, ...]:
    """The models of set `name` on `data`: "default" (the main job's), or "paper" (every row of the not-MIWAE
    paper's Yahoo! R3 table the package has); the oracle joins either on the simulator."""
    if name == "default":
        models = DEFAULT_MODELS
    else:
        models = tuple(model for model in (*VARIANTS, *BASELINES) if published(model) is not None)
    return models + (("oracle",) if data == "synthetic" else ())


def expand_model_sets(requested: tuple[str, ...], data: str) -> tuple[str, ...]:
    """`requested` with each model-set name replaced by its models, in place, each model kept once."""
    expanded = [model for name in requested for model in (model_set(name, data) if name in MODEL_SETS else (name,))]
    return tuple(dict.fromkeys(expanded))


def published(name: str) -> float | None:
    """Model `name`'s MCAR MSE in the not-MIWAE paper's Yahoo! R3 table, where it has a row."""
    return SPECS[name].published if name in SPECS else PUBLISHED.get(name)


def is_reference(name: str) -> bool:
    """Whether `name` is a reference row (the oracle, a constant predictor) rather than a method compared."""
    return name == "oracle" or (name in SPECS and SPECS[name].reference)


def uses_mcar_sample(name: str) -> bool:
    """Whether model `name` trains with the seed's MCAR sample (the not-MIWAE models and the oracle do not)."""
    return name in SPECS and SPECS[name].uses_mcar_sample
