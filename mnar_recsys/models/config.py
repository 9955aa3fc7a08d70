"""A typed, JSON-serialisable description of a model, and the one function that builds it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from numbers import Real

from torch import nn

from mnar_recsys.checks import check_positive_finite, check_positive_integer, is_integer, is_positive_integer
from mnar_recsys.models import decoders, encoders, missing
from mnar_recsys.models.activations import ACTIVATIONS
from mnar_recsys.models.notmiwae import NotMIWAE

ENCODERS = ("mlp", "set", "conv")
INITS = ("torch", "glorot")
#: missing model name -> the function that builds it from a config; `register_missing_model` adds one
MISSING_MODELS: dict[str, Callable[["ModelConfig"], missing.MissingModel]] = {
    "mcar": lambda cfg: missing.MCAR(),
    "self-masking": lambda cfg: missing.SelfMasking(cfg.n_features),
    "self-masking-known": lambda cfg: missing.SelfMaskingKnownSign(cfg.n_features, sign=cfg.missing_sign),
    "itemwise": lambda cfg: missing.ItemwiseLogistic(cfg.n_features, sign=cfg.missing_sign),
    "levelwise": lambda cfg: missing.LevelwiseLogistic(cfg.n_features, levels=cfg.levels),
    "agnostic": lambda cfg: missing.Agnostic(cfg.n_features),
    "nonlinear": lambda cfg: missing.Nonlinear(cfg.n_features, cfg.missing_hidden),
    "fixed-logistic": lambda cfg: missing.FixedLogistic(cfg.fixed_weight, cfg.fixed_offset),
}


def register_missing_model(name: str, build: Callable[["ModelConfig"], missing.MissingModel]) -> None:
    """Make `ModelConfig(missing=name)` build `build(config)`; the name must be new."""
    if name in MISSING_MODELS:
        raise ValueError(f"a missing model named {name!r} is already registered")
    MISSING_MODELS[name] = build


@dataclass
class ModelConfig:
    """Architecture of a (not-)MIWAE. Defaults are the paper's Yahoo! R3 setup (set encoder, embedding 20,
    code 50, latent 30, a Gaussian decoder with its mean squashed to 1..5 and shared variances, the item-wise
    logistic missing model) but for three choices: x_m integrated out rather than sampled, the item-wise
    weight's sign held (higher ratings more often observed), and q(z | x_o) with a variance per row (the
    encoder's), where the paper's summary shares the latent variances.

    The options of each field are on the field.
    """

    n_features: int
    latent_dim: int = 30
    activation: str = "relu"
    #: 'mlp' (zero-imputed, `encoder_hidden` layers), 'set' (PointNet / partial-VAE with `embedding_dim` and
    #: `code_dim`) or 'conv' (square images, strided convolutions with `conv_channels`; the 'conv-gaussian'
    #: decoder mirrors them).
    encoder: str = "set"
    encoder_hidden: tuple[int, ...] = (128, 128)
    embedding_dim: int = 20
    code_dim: int = 50
    conv_channels: tuple[int, ...] = (64, 128, 256)
    #: 'gaussian' (`decoder_hidden` layers, mean squashed to `squash` when given, `variance` 'shared' / 'per_row'
    #: / 'isotropic'), 'linear' (PPCA-like), 'categorical' over `levels` with Gumbel-Softmax at `temperature`,
    #: 'bernoulli', 'student-t', 'conv-gaussian' (images).
    decoder: str = "gaussian"
    decoder_hidden: tuple[int, ...] = ()
    squash: tuple[float, float] | None = (1.0, 5.0)
    variance: str = "shared"
    min_variance: float = 1e-3
    levels: tuple[int, int] = (1, 5)
    temperature: float = 0.5
    quadrature_points: int = 8
    #: 'mcar' (the MIWAE), 'self-masking', 'self-masking-known' (direction `missing_sign`: +1, the default, when
    #: larger values are more often observed, as ratings users chose to give; -1 when they go missing, as in the
    #: UCI protocol), 'itemwise' (one shared weight, per-item biases; sign-constrained unless `missing_sign` is
    #: None), 'levelwise' (a free logit per rating level in `levels`, interpolated between them, per-item
    #: biases), 'agnostic', 'nonlinear', 'fixed-logistic' (`fixed_weight` · (x - `fixed_offset`)).
    missing: str = "itemwise"
    missing_sign: int | None = 1
    missing_hidden: tuple[int, ...] = (64,)
    fixed_weight: float = -50.0
    fixed_offset: float = 0.75
    #: 'integrated' (x_m integrated out per feature) or 'sampled'.
    missing_factor: str = "integrated"
    #: None for the exact missing term; m >= 1 to train on its estimate from m uniform draws of unobserved items
    #: per row (large catalogues; see `NotMIWAE`; inference stays exact).
    unobserved_samples: int | None = None
    #: add a per-row shift w · z to the missing model's logits (users' activity; see `missing.RowOffset`).
    row_offset: bool = False
    #: 'torch' (PyTorch's default) or 'glorot' (Glorot-uniform weights and zero biases in the encoder's and
    #: decoder's dense layers, as in the paper's Keras code; see `glorot_init`).
    init: str = "torch"

    def __post_init__(self) -> None:
        for name, allowed in (("encoder", ENCODERS), ("decoder", tuple(DECODERS)), ("missing", tuple(MISSING_MODELS)),
                              ("activation", tuple(ACTIVATIONS)), ("init", INITS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("n_features", "latent_dim", "embedding_dim", "code_dim", "quadrature_points"):
            check_positive_integer(name, getattr(self, name))
        for name in ("encoder_hidden", "decoder_hidden", "missing_hidden", "conv_channels"):
            if not all(is_positive_integer(size) for size in getattr(self, name)):
                raise ValueError(f"{name} must hold positive integers (layer widths), got {getattr(self, name)!r}")
        for name in ("temperature", "min_variance"):
            check_positive_finite(name, getattr(self, name))
        if not (isinstance(self.levels, (tuple, list)) and len(self.levels) == 2
                and all(is_integer(level) for level in self.levels) and self.levels[0] < self.levels[1]):
            raise ValueError(f"levels must be two integers lo < hi (the rating levels lo..hi), got {self.levels!r}")
        if self.squash is not None and not (
                isinstance(self.squash, (tuple, list)) and len(self.squash) == 2
                and all(isinstance(end, Real) and not isinstance(end, bool) and math.isfinite(end)
                        for end in self.squash)
                and self.squash[0] < self.squash[1]):
            raise ValueError(f"squash must be None or two finite numbers lo < hi (the range of the Gaussian mean), "
                             f"got {self.squash!r}")
        if self.missing == "self-masking-known" and self.missing_sign not in (-1, 1):
            raise ValueError(f"self-masking-known needs missing_sign -1 (large values go missing) or +1 (large "
                             f"values are observed), got {self.missing_sign!r}")
        if self.unobserved_samples is not None:  # None: the exact missing term
            check_positive_integer("unobserved_samples", self.unobserved_samples)
        # JSON round trips turn tuples into lists
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                setattr(self, f.name, tuple(value))

    def to_dict(self) -> dict:
        return asdict(self)


def build_encoder(cfg: ModelConfig) -> nn.Module:
    act = ACTIVATIONS[cfg.activation]
    if cfg.encoder == "mlp":
        return encoders.MLPEncoder(cfg.n_features, cfg.latent_dim, cfg.encoder_hidden, act)
    if cfg.encoder == "set":
        return encoders.SetEncoder(cfg.n_features, cfg.latent_dim, cfg.embedding_dim, cfg.code_dim, act)
    return encoders.ConvEncoder(cfg.n_features, cfg.latent_dim, cfg.conv_channels)


def _conv_gaussian(cfg: ModelConfig) -> decoders.GaussianDecoder:
    mean_net = decoders.ConvMeanNet(cfg.latent_dim, cfg.n_features, cfg.conv_channels[::-1])  # mirrors the encoder
    return decoders.GaussianDecoder(cfg.latent_dim, cfg.n_features, squash=cfg.squash, variance=cfg.variance,
                                    min_variance=cfg.min_variance, quadrature_points=cfg.quadrature_points,
                                    mean_net=mean_net)


#: decoder name -> the function that builds it from a config; `register_decoder` adds one
DECODERS: dict[str, Callable[[ModelConfig], decoders.ObservationModel]] = {
    "gaussian": lambda cfg: decoders.GaussianDecoder(
        cfg.latent_dim, cfg.n_features, cfg.decoder_hidden, ACTIVATIONS[cfg.activation], cfg.squash, cfg.variance,
        cfg.min_variance, cfg.quadrature_points),
    "linear": lambda cfg: decoders.linear_gaussian_decoder(cfg.latent_dim, cfg.n_features, cfg.min_variance,
                                                           cfg.quadrature_points),
    "categorical": lambda cfg: decoders.CategoricalDecoder(cfg.latent_dim, cfg.n_features, cfg.levels,
                                                           cfg.decoder_hidden, ACTIVATIONS[cfg.activation],
                                                           cfg.temperature),
    "bernoulli": lambda cfg: decoders.BernoulliDecoder(cfg.latent_dim, cfg.n_features, cfg.decoder_hidden,
                                                       ACTIVATIONS[cfg.activation], cfg.temperature),
    "student-t": lambda cfg: decoders.StudentTDecoder(cfg.latent_dim, cfg.n_features, cfg.decoder_hidden,
                                                      ACTIVATIONS[cfg.activation]),
    "conv-gaussian": _conv_gaussian,
}


def register_decoder(name: str, build: Callable[[ModelConfig], decoders.ObservationModel]) -> None:
    """Make `ModelConfig(decoder=name)` build `build(config)`; the name must be new."""
    if name in DECODERS:
        raise ValueError(f"a decoder named {name!r} is already registered")
    DECODERS[name] = build


def build_decoder(cfg: ModelConfig) -> decoders.ObservationModel:
    return DECODERS[cfg.decoder](cfg)


def build_missing_model(cfg: ModelConfig) -> missing.MissingModel:
    return MISSING_MODELS[cfg.missing](cfg)


def glorot_init(model: NotMIWAE) -> NotMIWAE:
    """Glorot-uniform weights and zero biases in every dense layer of encoder and decoder, in place.

    This is the initialisation of the paper's (Keras / TF1) reference code. PyTorch's default draws
    first-layer weights about 2.5 times wider for 3-8 inputs and random biases; on MNAR tables that
    rougher tanh net extrapolates far past the missingness threshold (Banknote: imputation RMSE
    1.14-1.23 instead of 0.65-0.72 after 20k iterations, the overshoot in the feature that the observed
    ones predict best). The variance head keeps its bias, so every variance still starts near 1.
    """
    variance_head = getattr(model.decoder, "var_head", None)
    for module in (*model.encoder.modules(), *model.decoder.modules()):
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module is not variance_head:
                nn.init.zeros_(module.bias)
    return model


def build_model(cfg: ModelConfig) -> NotMIWAE:
    """The model a config describes, freshly initialised (seed torch first for reproducibility)."""
    row_offset = missing.RowOffset(cfg.latent_dim) if cfg.row_offset else None
    model = NotMIWAE(build_encoder(cfg), build_decoder(cfg), build_missing_model(cfg), cfg.latent_dim,
                     cfg.n_features, cfg.missing_factor, cfg.unobserved_samples, row_offset)
    return glorot_init(model) if cfg.init == "glorot" else model
