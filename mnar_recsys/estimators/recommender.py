"""The not-MIWAE as a recommender: cornac-style ``fit(train)`` / ``predict(users, items)``.

The torch module is the core's ``NotMIWAE``; this wrapper owns its config, its training matrix (a
user's prediction needs the user's observed ratings: they are what the encoder sees) and the
importance-sampling imputation that turns the model into predictions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from mnar_recsys.checks.ratings import check_fitted, check_pairs, check_ratings
from mnar_recsys.devices import resolve_device
from mnar_recsys.inference.importance import ImportanceConfig, Imputation, impute
from mnar_recsys.io import atomic_path
from mnar_recsys.models.config import ModelConfig, build_model
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.training import checkpoint, distributed
from mnar_recsys.training.seeds import seeded
from mnar_recsys.training.trainer import History, TrainConfig, fit

TRAIN_FILE = "train.npz"

# Named variants: ModelConfig fields on top of the defaults, which are the paper's Yahoo! R3 setup.
VARIANTS: dict[str, dict[str, Any]] = {
    "notmiwae-gaussian": {},
    "notmiwae-categorical": {"decoder": "categorical"},
    "miwae-gaussian": {"missing": "mcar", "missing_factor": "sampled"},
    "miwae-categorical": {"decoder": "categorical", "missing": "mcar", "missing_factor": "sampled"},
    "notmiwae-gaussian-sampled": {"missing_factor": "sampled"},
    # a free selection logit per rating level instead of one weight linear in the rating
    "notmiwae-gaussian-levelwise": {"missing": "levelwise"},
    "notmiwae-categorical-levelwise": {"decoder": "categorical", "missing": "levelwise"},
    # plus a per-user shift of the selection logits from z: users differ in how much they rate
    "notmiwae-gaussian-activity": {"row_offset": True},
    "notmiwae-categorical-activity": {"decoder": "categorical", "row_offset": True},
    "notmiwae-gaussian-levelwise-activity": {"missing": "levelwise", "row_offset": True},
    "notmiwae-categorical-levelwise-activity": {"decoder": "categorical", "missing": "levelwise", "row_offset": True},
}
# the variants' MCAR MSE in the not-MIWAE paper's Yahoo! R3 table
PUBLISHED: dict[str, float] = {"notmiwae-gaussian": 0.939, "notmiwae-categorical": 1.293, "miwae-gaussian": 2.055,
                               "miwae-categorical": 2.067}


@dataclass
class RecommenderConfig:
    """Everything a ``NotMIWAERecommender`` needs besides the data.

    model: ``ModelConfig`` fields except ``n_features`` (set by ``fit`` from the train matrix);
        unknown names or values are refused at construction.
    train: optimisation (K, batch, iterations, lr, device, progress bar).
    importance: prediction by importance sampling; ``n_samples`` is K_pred (1,000 by default for
        speed, the paper uses 10,000).
    rating_scale: predictions are clipped to it.
    seed: the one seed of a fit: it initialises the network and overrides the seeds in ``train``
        and ``importance``, so equal configs give equal predictions.
    """

    model: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    importance: ImportanceConfig = field(default_factory=lambda: ImportanceConfig(n_samples=1_000))
    rating_scale: tuple[float, float] = (1.0, 5.0)
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            self.train = TrainConfig(**self.train)
        if isinstance(self.importance, dict):
            self.importance = ImportanceConfig(**self.importance)
        self.rating_scale = tuple(self.rating_scale)
        if not (len(self.rating_scale) == 2 and all(math.isfinite(v) for v in self.rating_scale)
                and self.rating_scale[0] < self.rating_scale[1]):
            raise ValueError(f"rating_scale must be (low, high), finite, with low < high, got {self.rating_scale}")
        if "n_features" in self.model:
            raise ValueError("model must not set n_features: fit takes it from the train matrix")
        known = {f.name for f in fields(ModelConfig)}
        unknown = set(self.model) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}")
        # validates the values now rather than at fit time, and normalises them (JSON lists -> tuples)
        checked = self.model_config(1).to_dict()
        self.model = {name: checked[name] for name in self.model}

    def model_config(self, n_features: int) -> ModelConfig:
        """The ModelConfig for a train matrix with `n_features` items."""
        return ModelConfig(n_features=n_features, **self.model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def as_fitted(self, n_features: int) -> dict[str, Any]:
        """The config as a fit on `n_features` items uses it, for results: every ModelConfig field, not only
        the ones set, and the one seed in place of those of ``train`` and ``importance``."""
        return {**self.to_dict(), "model": self.model_config(n_features).to_dict(),
                "train": asdict(replace(self.train, seed=self.seed)),
                "importance": asdict(replace(self.importance, seed=self.seed))}


class NotMIWAERecommender:
    """A (not-)MIWAE fitted to a users x items rating matrix (Recommender protocol)."""

    def __init__(self, config: RecommenderConfig | None = None, name: str = "notmiwae"):
        self.config = config or RecommenderConfig()
        self.name = name
        self.model: NotMIWAE | None = None
        self.train: sp.csr_matrix | None = None
        self.history: History | None = None

    def fit(self, train: sp.csr_matrix) -> "NotMIWAERecommender":
        """Train on the stored (observed) ratings of `train`, one row per user."""
        train = check_ratings(train)
        cfg = self.config
        # the caller's torch random state is left as it was
        with seeded(cfg.seed, resolve_device(cfg.train.device)):
            model = build_model(cfg.model_config(train.shape[1]))
            self.history = fit(model, train, replace(cfg.train, seed=cfg.seed))
        self.model, self.train = model, train
        return self

    def settings(self) -> dict[str, Any]:
        """The config as the fit used it (``RecommenderConfig.as_fitted``), for a results record."""
        check_fitted(self, "model")
        return self.config.as_fitted(self.train.shape[1])

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Conditional-mean ratings of (users[i], items[i]), clipped to the rating scale.

        Each user is encoded from their training ratings and the items imputed by self-normalised
        importance sampling; only the users asked about are processed. One seeded stream draws the noise of
        all of them, so a call repeats exactly, but a user's prediction moves, within Monte Carlo error, with
        the other users asked about in the same call.
        """
        return np.clip(self.impute(users, items).mean, *self.config.rating_scale)

    def impute(self, users: np.ndarray, items: np.ndarray) -> Imputation:
        """The importance-sampling imputation behind `predict`, unclipped, with its weights' effective
        sample size: `ess[r]` for the r-th distinct user of `users` in sorted order."""
        check_fitted(self, "model")
        users, items = check_pairs(users, items, self.train.shape)
        # impute() visits every row it is given, so hand it only the requested users' rows
        present, rows = np.unique(users, return_inverse=True)
        return impute(self.model, self.train[present], rows=rows, cols=items, methods=("mean",),
                      config=replace(self.config.importance, seed=self.config.seed))

    def save(self, directory: str | Path) -> Path:
        """Write the train matrix and the model (checkpoint format) with the recommender config, whose
        record of the files' digests lets `load` refuse a save that was interrupted."""
        check_fitted(self, "model")
        directory = Path(directory)
        if distributed.is_main_process():  # as in checkpoint.save: every process of a data-parallel job holds it
            with atomic_path(directory / TRAIN_FILE, suffix=".npz") as tmp:
                sp.save_npz(tmp, self.train)
        return checkpoint.save(self.model, self.config.model_config(self.train.shape[1]), directory,
                               extra={"recommender": {**self.config.to_dict(), "name": self.name}},
                               companions=(TRAIN_FILE,))

    @classmethod
    def load(cls, directory: str | Path, map_location: str = "cpu") -> "NotMIWAERecommender":
        """Rebuild a recommender written by `save`, ready to predict."""
        directory = Path(directory)
        if not (directory / TRAIN_FILE).is_file():
            raise FileNotFoundError(f"{directory / TRAIN_FILE} is missing: not a saved recommender directory")
        model, _, meta = checkpoint.load(directory, map_location=map_location)
        if not (isinstance(meta.get("recommender"), dict) and isinstance(meta["recommender"].get("name"), str)):
            raise ValueError(f"{directory} holds a model checkpoint but no recommender config with its name")
        settings = dict(meta["recommender"])
        name = settings.pop("name")
        recommender = cls(checkpoint.config_from(RecommenderConfig, settings, directory / checkpoint.CONFIG_FILE,
                                                 meta.get(checkpoint.PROVENANCE_KEY)), name=name)
        recommender.model, recommender.train = model, sp.load_npz(directory / TRAIN_FILE).tocsr()
        return recommender


def make_recommender(name: str, seed: int = 0, train: TrainConfig | None = None,
                     importance: ImportanceConfig | None = None, rating_scale: tuple[float, float] = (1.0, 5.0),
                     **model: Any) -> NotMIWAERecommender:
    """The named variant (one of ``VARIANTS``); keyword `model` fields override the variant's."""
    if name not in VARIANTS:
        raise ValueError(f"unknown not-MIWAE variant {name!r}; choose from {', '.join(VARIANTS)}")
    spec = {**VARIANTS[name], **model}
    scale = {"squash": tuple(float(v) for v in rating_scale)}
    if all(float(v).is_integer() for v in rating_scale):
        scale["levels"] = tuple(int(v) for v in rating_scale)
    elif (spec.get("decoder") == "categorical" or spec.get("missing") == "levelwise") \
            and all(math.isfinite(v) for v in rating_scale):  # int() would move the ends; RecommenderConfig names inf
        raise ValueError(f"{name} models ratings on the integer levels lo..hi: rating_scale {tuple(rating_scale)} "
                         "does not end on integers")
    config = RecommenderConfig(model={**scale, **spec}, train=train or TrainConfig(),
                               importance=importance or ImportanceConfig(n_samples=1_000),
                               rating_scale=rating_scale, seed=seed)
    return NotMIWAERecommender(config, name=name)


class OracleRecommender:
    """Predicts a known matrix of expected ratings (the simulator's ``meta["oracle"]``): the lowest expected
    squared error of a prediction that knows the generating model but not the realised ratings. A test
    cell that is also rated in train repeats that rating, which a model fitting the train can exploit."""

    name = "oracle"

    def __init__(self, expected: np.ndarray):
        self.expected = np.asarray(expected)
        if self.expected.ndim != 2:
            raise ValueError(f"the oracle needs a users x items matrix, got shape {self.expected.shape}")

    def fit(self, train: sp.csr_matrix) -> "OracleRecommender":
        """Nothing to learn; checks that `train` matches the oracle's shape."""
        if train.shape != self.expected.shape:
            raise ValueError(f"train shape {train.shape} != oracle shape {self.expected.shape}")
        return self

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        users, items = check_pairs(users, items, self.expected.shape)
        return self.expected[users, items].astype(np.float64)
