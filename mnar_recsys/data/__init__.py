"""Rating data sets: loaders for Yahoo! R3, Coat and generic triples, and the synthetic MNAR simulator."""

from .coat import load_coat, load_coat_propensities
from .files import ChecksumWarning
from .ratings import RatingsData
from .simulator import SimulatorConfig, simulate_ratings
from .triples import load_triples
from .yahoo import load_yahoo_r3

__all__ = [
    "ChecksumWarning",
    "RatingsData",
    "SimulatorConfig",
    "load_coat",
    "load_coat_propensities",
    "load_triples",
    "load_yahoo_r3",
    "simulate_ratings",
]
