"""Real MNAR data: on Coat, inverse-propensity weighting must beat plain MF on the MCAR test
(Schnabel et al. 2016 report MSE 1.202 for MF and 1.093 for MF-IPS), and so do the doubly robust MF and
AutoRec, the latter with no MCAR data."""

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from baselines.registry import make_baseline
from mnar_recsys.data import load_coat_propensities
from mnar_recsys.data.splits import split_mcar_sample
from mnar_recsys.evaluation.metrics import mse

# The shared copy sits beside the project root; MNAR_RECSYS_COAT_DIR overrides it (e.g. in a worktree).
COAT = Path(os.environ.get("MNAR_RECSYS_COAT_DIR",
                          Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "coat"))


@pytest.fixture(scope="module")
def coat() -> tuple[sp.csr_matrix, sp.csr_matrix]:
    if not (COAT / "train.ascii").exists() or not (COAT / "test.ascii").exists():
        pytest.skip(f"Coat data not found at {COAT.resolve()}")
    load = lambda name: sp.csr_matrix(np.loadtxt(COAT / name))  # noqa: E731 - 0 = unrated, so CSR keeps ratings only
    return load("train.ascii"), load("test.ascii")


@pytest.mark.parametrize("seed", [0, 1])
def test_mf_ips_beats_mf_on_coat(coat, seed):
    train, test = coat
    assert train.shape == (290, 300) and train.nnz == 6960 and test.nnz == 4640
    sample, rest = split_mcar_sample(test, fraction=0.05, seed=seed)
    scored = rest.tocoo()

    def score(name: str, **kwargs: object) -> float:
        model = make_baseline(name, seed=seed, **kwargs).fit(train)
        return mse(scored.data, model.predict(scored.row, scored.col))

    mf, mf_ips = score("mf"), score("mf-ips", mcar_sample=sample)
    assert mf < 1.3  # near the published 1.202
    assert mf_ips < mf - 0.05  # published gain: 0.109
    assert score("mf-ips-mask") < mf
    assert score("mf-dr", mcar_sample=sample) < mf - 0.03  # measured 1.176 and 1.136 on seeds 0 and 1
    assert score("autorec") < mf - 0.1  # measured 0.987 and 0.989 on seeds 0 and 1, MF 1.222 and 1.208
    if (COAT / "propensities.ascii").is_file():  # the authors' own, behind the published 1.093
        given = load_coat_propensities(COAT)
        assert score("mf-ips-given", propensities=given) < mf - 0.05
        assert score("mf-dr-given", propensities=given) < mf - 0.03  # measured 1.159 and 1.161
