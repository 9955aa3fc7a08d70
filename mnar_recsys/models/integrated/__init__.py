"""x_m integrated out of a per-feature missing model: the factor log Pr(s_j = 0 | z) as plug-ins (`base`), one
module per (decoder family, logit form) with its kernels, registered on import."""

from mnar_recsys.models.integrated import categorical, gaussian_affine, gaussian_piecewise  # noqa: F401  registers
from mnar_recsys.models.integrated.base import (
    ANY_FORM,
    GENERIC,
    GenericQuadrature,
    IntegratedFactor,
    factor_for,
    register_factor,
    unregister_factor,
)

__all__ = ["ANY_FORM", "GENERIC", "GenericQuadrature", "IntegratedFactor", "factor_for", "register_factor",
           "unregister_factor"]
