"""Missing models of the multinomial mixture: mu_vd = P(observed | rating level v, item d), with a prior
and a MAP M-step each (Marlin et al., UAI 2007: CPT-v; Marlin & Zemel, RecSys 2009: Logit-vd).

An M-step sees two V x D count tables from the E-step: ``observed[v, d]``, the number of observed
ratings v of item d, and ``unobserved[v, d]``, the expected number of unobserved cells of item d whose
rating is v. Both maximise sum_vd [observed log mu_vd + unobserved log(1 - mu_vd)] + log prior.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, logit

_EDGE = 1e-12  # CPT-v's mu is kept this far inside (0, 1) when set from unconstrained parameters


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log sigmoid(x) without overflow for large |x|."""
    return -np.logaddexp(0.0, -x)


@dataclass
class CPTv:
    """mu_v per rating level, shared by all items, with prior Beta(1 + strength * centre_v,
    1 + strength * (1 - centre_v)): ``strength`` pseudo-cells per level observed at rate ``centre_v``,
    so the MAP M-step is the closed form mu_v = (n_v + strength * centre_v) / (n_v + M_v + strength)."""

    centre: np.ndarray
    strength: float
    n_items: int
    mu: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.mu = np.array(self.centre, dtype=np.float64)

    def log_mu(self) -> tuple[np.ndarray, np.ndarray]:
        """(log mu, log(1 - mu)), each V x D."""
        shape = (len(self.mu), self.n_items)
        return (np.broadcast_to(np.log(self.mu)[:, None], shape),
                np.broadcast_to(np.log1p(-self.mu)[:, None], shape))

    def parameters(self) -> list[np.ndarray]:
        """logit mu, the unconstrained form extrapolated between EM steps."""
        return [logit(self.mu)]

    def set_parameters(self, values: list[np.ndarray]) -> None:
        self.mu = np.clip(expit(values[0]), _EDGE, 1.0 - _EDGE)

    def m_step(self, observed: np.ndarray, unobserved: np.ndarray) -> None:
        n, m = observed.sum(axis=1), unobserved.sum(axis=1)
        self.mu = (n + self.strength * self.centre) / (n + m + self.strength)

    def log_prior(self) -> float:
        s, c = self.strength, self.centre
        return float(np.sum(s * c * np.log(self.mu) + s * (1.0 - c) * np.log1p(-self.mu)))


def logit_vd_objective(omega: np.ndarray, psi: np.ndarray, observed: np.ndarray, unobserved: np.ndarray,
                       omega0: np.ndarray, omega_sd: float, psi_sd: float
                       ) -> tuple[float, np.ndarray, np.ndarray]:
    """Logit-vd's M-step objective and its gradient (value, d/d omega, d/d psi), mu_vd = sigmoid(omega_v + psi_d):

        f = sum_vd [A_vd log mu_vd + B_vd log(1 - mu_vd)] - |omega - omega0|^2 / (2 omega_sd^2) - |psi|^2 / (2 psi_sd^2)

    with A = ``observed``, B = ``unobserved``. Since d log mu / d eta = 1 - mu and d log(1 - mu) / d eta = -mu,
    df/d omega_v = sum_d [A_vd (1 - mu_vd) - B_vd mu_vd] - (omega_v - omega0_v) / omega_sd^2, and likewise
    df/d psi_d = sum_v [...] - psi_d / psi_sd^2.
    """
    eta = omega[:, None] + psi[None, :]
    value = float(np.sum(observed * log_sigmoid(eta) + unobserved * log_sigmoid(-eta))
                  - np.sum((omega - omega0) ** 2) / (2 * omega_sd ** 2) - np.sum(psi ** 2) / (2 * psi_sd ** 2))
    mu = expit(eta)
    resid = observed * (1.0 - mu) - unobserved * mu
    return value, resid.sum(axis=1) - (omega - omega0) / omega_sd ** 2, resid.sum(axis=0) - psi / psi_sd ** 2


@dataclass
class LogitVD:
    """mu_vd = sigmoid(omega_v + psi_d) with priors omega ~ N(omega0, omega_sd^2), psi ~ N(0, psi_sd^2); the
    priors pin the shared offset of omega and psi, which the likelihood leaves free. The M-step takes
    ``iters`` L-BFGS steps from the current values (generalised EM), kept only if they raise the objective."""

    omega0: np.ndarray
    omega_sd: float
    psi_sd: float
    psi_init: np.ndarray
    iters: int
    omega: np.ndarray = field(init=False)
    psi: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.omega = np.array(self.omega0, dtype=np.float64)
        self.psi = np.array(self.psi_init, dtype=np.float64)

    def log_mu(self) -> tuple[np.ndarray, np.ndarray]:
        eta = self.omega[:, None] + self.psi[None, :]
        return log_sigmoid(eta), log_sigmoid(-eta)

    def parameters(self) -> list[np.ndarray]:
        return [self.omega.copy(), self.psi.copy()]

    def set_parameters(self, values: list[np.ndarray]) -> None:
        self.omega, self.psi = np.array(values[0], dtype=np.float64), np.array(values[1], dtype=np.float64)

    def _objective(self, omega: np.ndarray, psi: np.ndarray, observed: np.ndarray,
                   unobserved: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        return logit_vd_objective(omega, psi, observed, unobserved, self.omega0, self.omega_sd, self.psi_sd)

    def m_step(self, observed: np.ndarray, unobserved: np.ndarray) -> None:
        v = len(self.omega)

        def negative(x: np.ndarray) -> tuple[float, np.ndarray]:
            value, d_omega, d_psi = self._objective(x[:v], x[v:], observed, unobserved)
            return -value, -np.concatenate([d_omega, d_psi])

        start = np.concatenate([self.omega, self.psi])
        result = minimize(negative, start, jac=True, method="L-BFGS-B", options={"maxiter": self.iters})
        if result.fun <= negative(start)[0]:  # generalised EM: never step down
            self.omega, self.psi = result.x[:v].copy(), result.x[v:].copy()

    def log_prior(self) -> float:
        return float(-np.sum((self.omega - self.omega0) ** 2) / (2 * self.omega_sd ** 2)
                     - np.sum(self.psi ** 2) / (2 * self.psi_sd ** 2))
