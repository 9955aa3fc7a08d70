"""mnar_recsys: deep latent variable models for data missing not at random (not-MIWAE)."""

__version__ = "0.1.0"
