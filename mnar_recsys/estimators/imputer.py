"""The not-MIWAE as a scikit-learn imputer: NaN in, importance-sampling conditional means out.

The estimator standardises each feature by the mean / sd of its observed values (so one architecture
and learning rate fit any units), trains a (not-)MIWAE with the paper's UCI architecture (two dense
tanh layers of `hidden` units in encoder and decoder, latent size p - 1) and maps imputations back to
the original units.

``NotMIWAEImputer``'s parameters:

decoder: 'gaussian' (dense tanh layers, a learned per-row variance) or 'linear' (PPCA-like:
    x = W z + b with one variance shared by all features).
missing: the missing model p(s|x): 'mcar' (the MIWAE), 'agnostic' (a linear layer of the row),
    'self-masking' (a logistic regression per feature on its own value) or 'self-masking-known'
    (the same with its direction fixed by `missing_sign`: -1 = large values go missing).
latent_dim: None gives p - 1 (the paper), at least 1.
hidden: units of the two hidden layers of encoder and decoder.
n_samples: K of the training bound; iterations, batch_size, lr: Adam's schedule (the paper's UCI
    protocol: 100k iterations of 16 rows, lr 1e-3).
importance_samples: samples per row for the conditional mean in `transform`.
missing_factor: 'integrated', 'sampled' or 'auto' (integrated for the per-feature missing models).
standardize: scale features by the observed mean / sd before fitting (imputations are returned in
    the original units either way).
random_state: seeds initialisation, training and imputation (None: fresh randomness).
device: 'auto' (CUDA when available), 'cpu' or 'cuda'; progress: show progress bars (training and imputation).
sampled_imputation: with x_m sampled (the agnostic model's 'auto' factor, or missing_factor='sampled'),
    what `transform` averages under the importance weights: 'decoder-mean' (the paper's code) or
    'draws' (the drawn x_m, consistent; see `importance.ImportanceConfig`).
n_init: fits from as many seeds, of which the one whose rows score highest (`score`) is kept, as
    `GaussianMixture` keeps its best initialisation: the self-masking model of unknown sign can settle
    with a feature's sign the wrong way round, and scores lower there. 1 (the paper's protocol) fits once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from mnar_recsys.checks import check_positive_integer
from mnar_recsys.checks.dense import column_name, non_numeric_error, pandas_missing_as_nan, standardisation
from mnar_recsys.devices import resolve_device
from mnar_recsys.inference import importance
from mnar_recsys.models.config import ModelConfig, build_missing_model, build_model
from mnar_recsys.models.notmiwae import NotMIWAE
from mnar_recsys.training.seeds import seeded
from mnar_recsys.training.stacked import fit_stacked, stackable
from mnar_recsys.training.trainer import History, TrainConfig, TrainingDiverged, fit

DECODERS = ("gaussian", "linear")
MISSING = ("mcar", "agnostic", "self-masking", "self-masking-known")
# the fitted attributes scikit-learn's validate_data sets from the training data
_INPUT_ATTRIBUTES = ("n_features_in_", "feature_names_in_")


class NotMIWAEImputer(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Impute NaN entries with a not-MIWAE (or the MIWAE, `missing='mcar'`).

    Its parameters and fitted attributes are listed in the module docstring.

    `score(X)` is the mean log-likelihood estimate of the rows (higher is better).

    Attributes: model_ (the trained `NotMIWAE`), history_ (the training `History`), n_features_in_,
    mean_ and scale_ (the fitted standardisation), seed_ (the integer seed of the kept fit), init_scores_
    (each fit's score in seed order, in standardised units; None with n_init = 1, which scores nothing).
    """

    def __init__(self, decoder: str = "gaussian", missing: str = "self-masking-known", missing_sign: int = -1,
                 latent_dim: int | None = None, hidden: int = 128, n_samples: int = 20, iterations: int = 100_000,
                 batch_size: int = 16, lr: float = 1e-3, importance_samples: int = 10_000,
                 missing_factor: str = "auto", standardize: bool = True, random_state: int | None = None,
                 device: str = "auto", progress: bool = False, sampled_imputation: str = "decoder-mean",
                 n_init: int = 1):
        self.decoder = decoder
        self.missing = missing
        self.missing_sign = missing_sign
        self.latent_dim = latent_dim
        self.hidden = hidden
        self.n_samples = n_samples
        self.iterations = iterations
        self.batch_size = batch_size
        self.lr = lr
        self.importance_samples = importance_samples
        self.missing_factor = missing_factor
        self.standardize = standardize
        self.random_state = random_state
        self.device = device
        self.progress = progress
        self.sampled_imputation = sampled_imputation
        self.n_init = n_init

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # NaN marks the entries to impute
        return tags

    def _validate(self, X, reset: bool) -> np.ndarray:
        X = pandas_missing_as_nan(X)
        try:  # infinities are let through here to be refused below, naming where the first is
            array = validate_data(self, X, dtype=np.float64, ensure_all_finite=False, reset=reset)
        except ValueError as error:  # not TypeError: scikit-learn's checks expect its own for a dict or the like
            named = non_numeric_error(X, "NotMIWAEImputer")
            if named is None:
                raise
            raise named from error
        infinite = np.argwhere(np.isinf(array))
        if infinite.size:
            i, j = infinite[0]
            column = column_name(getattr(self, "feature_names_in_", None), j)
            raise ValueError(f"NotMIWAEImputer: X holds {len(infinite)} infinite values, the first {array[i, j]} in "
                             f"row {i}, {column}; mark a missing entry with NaN")
        return array

    def model_config(self, n_features: int) -> ModelConfig:
        """The architecture this estimator trains for `n_features` features."""
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {self.decoder!r}")
        if self.missing not in MISSING:
            raise ValueError(f"missing must be one of {MISSING}, got {self.missing!r}")
        factor = self.missing_factor
        if factor == "auto":  # per-feature missing models can have x_m integrated out (less noisy weights)
            factor = "integrated" if build_missing_model(ModelConfig(n_features=1, missing=self.missing)).per_feature \
                else "sampled"
        latent = max(n_features - 1, 1) if self.latent_dim is None else self.latent_dim
        return ModelConfig(n_features=n_features, latent_dim=latent, activation="tanh", encoder="mlp",
                           encoder_hidden=(self.hidden, self.hidden), decoder=self.decoder,
                           decoder_hidden=(self.hidden, self.hidden), squash=None, variance="per_row",
                           missing=self.missing, missing_sign=self.missing_sign, missing_factor=factor,
                           init="glorot")

    def fit(self, X: ArrayLike, y: object = None) -> "NotMIWAEImputer":
        """Train on X (NaN = missing); y is ignored. A fit that fails leaves the last fit whole, and the
        caller's torch random state is as it was."""
        with _last_fits_kept([self]):
            return self._fit(X)

    def _fit(self, X) -> "NotMIWAEImputer":
        standardized, mean, scale, config = self._prepare(X)
        starts = self._starts(config)
        self._set_fitted(mean, scale, *self._best(_train(starts, standardized), standardized))
        return self

    def _prepare(self, X) -> tuple[np.ndarray, np.ndarray, np.ndarray, ModelConfig]:
        """Validate X and every setting before any training: (X standardised, its mean, its scale, the model)."""
        X = self._validate(X, reset=True)
        empty = np.flatnonzero(np.isnan(X).all(axis=0))
        if empty.size:
            names = ", ".join(column_name(getattr(self, "feature_names_in_", None), j) for j in empty)
            raise ValueError(f"NotMIWAEImputer: {names} entirely missing: nothing can be learnt about it "
                             "(drop it before imputing)")
        config = self.model_config(X.shape[1])
        self._importance_config(seed=0)  # refuses bad importance settings here, not after training
        check_positive_integer("n_init", self.n_init)
        mean, scale = standardisation(X, "NotMIWAEImputer", self.standardize)
        return (X - mean) / scale, mean, scale, config

    def _starts(self, config: ModelConfig) -> list[tuple[int, ModelConfig, TrainConfig]]:
        """One (seed, model config, training config) per start, the seeds drawn from random_state."""
        rng = check_random_state(self.random_state)
        seeds = [int(rng.randint(2 ** 31 - 1)) for _ in range(self.n_init)]
        return [(seed, config, TrainConfig(iterations=self.iterations, batch_size=self.batch_size,
                                           n_samples=self.n_samples, lr=self.lr, seed=seed, device=self.device,
                                           progress=self.progress)) for seed in seeds]

    def _best(self, trained: list[tuple[NotMIWAE, "History | TrainingDiverged", int]],
              standardized: np.ndarray) -> tuple[list[float] | None, tuple[NotMIWAE, History, int]]:
        """(the starts' scores, None for one start; the kept (model, history, seed)): of this estimator's trained
        starts, the one whose rows score highest; TrainingDiverged where none is left."""
        scores = None if self.n_init == 1 else []
        best_score, best = -np.inf, None
        for model, history, seed in trained:
            if isinstance(history, TrainingDiverged):
                if scores is None or (best is None and len(scores) == self.n_init - 1):
                    raise history  # one fit only, or the last of starts that all diverged
                scores.append(float("nan"))  # one of several starts diverged: the others may not
                continue
            score = -np.inf
            if scores is not None:
                score = self._mean_log_likelihood(model, seed, standardized)
                scores.append(score)
            # only the best fit so far is held; a NaN score never displaces a fit, nor is kept past the first
            if best is None or score > best_score:
                best = model, history, seed
            best_score = max(best_score, score)
        return scores, best

    def _set_fitted(self, mean: np.ndarray, scale: np.ndarray, scores: list[float] | None,
                    best: tuple[NotMIWAE, History, int]) -> None:
        # the fitted attributes are set together at the end: a failed refit leaves the last fit whole
        self.mean_, self.scale_, self.init_scores_ = mean, scale, scores
        self.model_, self.history_, self.seed_ = best

    def _importance_config(self, seed: int) -> importance.ImportanceConfig:
        return importance.ImportanceConfig(n_samples=self.importance_samples, seed=seed, device=self.device,
                                           progress=self.progress, sampled_imputation=self.sampled_imputation)

    def _mean_log_likelihood(self, model, seed: int, standardized: np.ndarray) -> float:
        """Mean over the rows of log p(x_o, s) under `model`, in standardised units."""
        config = self._importance_config(seed)
        return float(importance.log_likelihood(model, standardized, config=config).mean())

    def transform(self, X: ArrayLike) -> np.ndarray:
        """X with every NaN replaced by its importance-sampling conditional mean (observed values kept)."""
        return self._imputed(X)[1]

    def transform_and_score(self, X: ArrayLike) -> tuple[np.ndarray, float]:
        """`transform(X)` and `score(X)` from one importance pass over the rows, half the work of the two calls:
        the score is `score`'s estimator on the imputation's draws (equal to it for the not-MIWAE, within Monte
        Carlo error of it for the MIWAE, whose imputation splits the samples otherwise)."""
        X, imputed, result = self._imputed(X)
        if result is None:  # nothing was missing, so no pass ran
            return imputed, self.score(X)
        return imputed, self._in_units_of(X, float(result.log_likelihood.mean()))

    def _imputed(self, X: ArrayLike) -> tuple[np.ndarray, np.ndarray, importance.Imputation | None]:
        """X validated, X imputed, and the importance pass's result (None where X has no NaN)."""
        check_is_fitted(self)
        X = self._validate(X, reset=False)
        out = X.copy()
        if not np.isnan(X).any():
            return X, out, None
        result = importance.impute(self.model_, (X - self.mean_) / self.scale_,
                                   config=self._importance_config(self.seed_))
        out[result.rows, result.cols] = result.mean * self.scale_[result.cols] + self.mean_[result.cols]
        return X, out, result

    def score(self, X: ArrayLike, y: object = None) -> float:
        """Mean over rows of the importance-sampling estimate of log p(x_o, s) (log p(x_o) for the MIWAE), in
        nats, with `importance_samples` samples per row; y is ignored. As `GaussianMixture.score`, higher is
        better, and the density is that of X in its own units: it compares fits to the same data without the
        truth, e.g. runs from different seeds."""
        check_is_fitted(self)
        X = self._validate(X, reset=False)
        return self._in_units_of(X, self._mean_log_likelihood(self.model_, self.seed_, (X - self.mean_) / self.scale_))

    def _in_units_of(self, X: np.ndarray, in_standard_units: float) -> float:
        """A mean log-density of X's standardised rows as one of X's own: the change of variables back from
        standardised units, each observed x_j having been divided by scale_j."""
        return in_standard_units - float((~np.isnan(X) * np.log(self.scale_)).sum(1).mean())

    def mask_accuracy(self, X_complete: ArrayLike, mask: ArrayLike) -> float:
        """Accuracy of the learnt missing model's predicted mask (1 = observed) on fully observed rows."""
        check_is_fitted(self)
        X = self._validate(X_complete, reset=False)
        return importance.mask_accuracy(self.model_, (X - self.mean_) / self.scale_, mask)


def _build(seed: int, config: ModelConfig, device: str) -> NotMIWAE:
    with seeded(seed, resolve_device(device)):  # the initialisation; training seeds its own streams
        return build_model(config)


def _train(starts: list[tuple[int, ModelConfig, TrainConfig]],
           standardized: np.ndarray) -> list[tuple[NotMIWAE, "History | TrainingDiverged", int]]:
    """Each start trained: (model, its history or the TrainingDiverged it raised, seed). Several starts of one
    architecture that the stacked pass has train as one stacked fit, each equal to its own fit up to rounding;
    should one diverge there, all train one by one, so that the others are kept as `fit` keeps them."""
    models = [_build(seed, config, train.device) for seed, config, train in starts]
    configs = [train for _, _, train in starts]
    if len(starts) > 1 and stackable(models, configs):
        try:
            with torch.random.fork_rng():  # the caller's random state as it was (the fit seeds its own)
                histories = fit_stacked(models, standardized, configs)
            return [(model, history, seed) for model, history, (seed, _, _) in zip(models, histories, starts)]
        except TrainingDiverged:
            models = [_build(seed, config, train.device) for seed, config, train in starts]
    trained = []
    for model, (seed, _, train) in zip(models, starts):
        try:
            with seeded(seed, resolve_device(train.device)):
                trained.append((model, fit(model, standardized, train), seed))
        except TrainingDiverged as error:
            trained.append((model, error, seed))
    return trained


def fit_imputers(imputers: list[NotMIWAEImputer], X: ArrayLike) -> list[NotMIWAEImputer]:
    """Fit each imputer on X as its `fit` does. Imputers that differ in `random_state` alone train together, all
    their starts as one stacked fit where the architecture allows it (`training.stacked`): runs of one model
    from several seeds, as `uci --runs` fits them."""
    params = [{k: v for k, v in imputer.get_params().items() if k != "random_state"} for imputer in imputers]
    if len(imputers) < 2 or any(p != params[0] for p in params):
        return [imputer.fit(X) for imputer in imputers]
    with _last_fits_kept(imputers):  # a failure leaves every imputer's last fit whole
        prepared = [imputer._prepare(X) for imputer in imputers]
        starts = [imputer._starts(config) for imputer, (_, _, _, config) in zip(imputers, prepared)]
        trained = _train([start for own in starts for start in own], prepared[0][0])
        n = imputers[0].n_init
        kept = [imputer._best(trained[index * n:(index + 1) * n], standardized)
                for index, (imputer, (standardized, _, _, _)) in enumerate(zip(imputers, prepared))]
        for imputer, (_, mean, scale, _), (scores, best) in zip(imputers, prepared, kept):
            imputer._set_fitted(mean, scale, scores, best)
    return imputers


@contextmanager
def _last_fits_kept(imputers: list[NotMIWAEImputer]) -> Iterator[None]:
    """On failure, put back the input attributes that validate_data(reset=True) set before anything could fail,
    so that each imputer's last fit stays whole."""
    saved = [{name: getattr(imputer, name) for name in _INPUT_ATTRIBUTES if hasattr(imputer, name)}
             for imputer in imputers]
    try:
        yield
    except BaseException:
        for imputer, attributes in zip(imputers, saved):
            for name in _INPUT_ATTRIBUTES:
                if name in attributes:
                    setattr(imputer, name, attributes[name])
                elif hasattr(imputer, name):
                    delattr(imputer, name)
        raise
