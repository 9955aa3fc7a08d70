"""The tanh layer: torch's tanh to float rounding, by the compiled rational tanh where no gradient is taken and
torch's tanh is not the fast one; the rational tanh within its stated error, with its gradient."""

import pytest
import torch

from mnar_recsys.models import activations
from mnar_recsys.models.activations import Tanh, tanh_rational

RATIONAL_ERROR = 4.2e-7  # the rational tanh's largest error in float32, at |x| near 8.6


@pytest.mark.parametrize("torch_fast", [False, True])
def test_tanh_equals_torchs_to_rounding_in_and_out_of_a_gradient(monkeypatch, torch_fast):
    monkeypatch.setattr(activations, "torch_tanh_is_fast", lambda: torch_fast)
    x = torch.cat([torch.linspace(-30, 30, 20001), torch.tensor([0.0, 1e-30, -1e-30, float("inf"), -float("inf")])])
    with torch.no_grad():
        fast = Tanh()(x)
    torch.testing.assert_close(fast, torch.tanh(x), atol=RATIONAL_ERROR, rtol=0)
    assert fast.abs().max() <= 1
    leaf = x[:-2].clone().requires_grad_()
    Tanh()(leaf).sum().backward()
    torch.testing.assert_close(leaf.grad, 1 - torch.tanh(leaf.detach()) ** 2)


def test_the_compiled_kernel_runs_without_gradients_only(monkeypatch):
    monkeypatch.setattr(activations, "torch_tanh_is_fast", lambda: False)
    calls = []
    kernel = activations._compiled_tanh
    monkeypatch.setattr(activations, "_compiled_tanh", lambda x: calls.append(x.shape) or kernel(x))
    x = torch.randn(3, 5)
    with torch.no_grad():
        Tanh()(x)
    Tanh()(x)  # no input needs a gradient
    Tanh()(x.requires_grad_())
    assert calls == [(3, 5), (3, 5)]


def test_where_torchs_tanh_is_the_fast_one_it_runs_without_gradients_too(monkeypatch):
    monkeypatch.setattr(activations, "torch_tanh_is_fast", lambda: True)
    calls = []
    monkeypatch.setattr(activations, "_compiled_tanh", lambda x: calls.append(x.shape))
    x = torch.randn(3, 5)
    with torch.no_grad():
        assert torch.equal(Tanh()(x), torch.tanh(x))
    assert calls == []


@pytest.mark.parametrize("mode", ["0", "1"])
def test_eager_and_compiled_agree(monkeypatch, mode):
    monkeypatch.setattr(activations, "torch_tanh_is_fast", lambda: False)
    monkeypatch.setenv("MNAR_RECSYS_COMPILE", mode)
    x = torch.randn(4, 7, 9) * 3
    with torch.no_grad():
        torch.testing.assert_close(Tanh()(x), torch.tanh(x), atol=RATIONAL_ERROR, rtol=0)


def test_the_rational_tanh_is_within_its_stated_error_and_its_gradient_is_one_minus_its_square():
    x = torch.cat([torch.linspace(-12, 12, 200_001), torch.tensor([0.0, 1e-30, -1e-30, 9.0, -9.0, 40.0])])
    y = tanh_rational(x)
    assert (y.double() - torch.tanh(x.double())).abs().max() < RATIONAL_ERROR
    assert torch.equal(tanh_rational(-x), -y) and y.abs().max() <= 1
    assert tanh_rational(torch.tensor([1e-30])).item() == pytest.approx(1e-30, rel=1e-6)
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(tanh_rational(leaf).sum(), leaf)
    torch.testing.assert_close(grad, 1 - y * y)
    assert (grad.double() - (1 - torch.tanh(x.double()) ** 2)).abs().max() < 1e-6


def test_the_rational_tanh_has_its_gradient_under_torch_func_and_torch_compile():
    x = torch.linspace(-5, 5, 1001)
    expected = torch.func.grad(lambda t: torch.tanh(t).square().sum())(x)
    traced = torch.compile(torch.func.grad(lambda t: tanh_rational(t).square().sum()), dynamic=False)
    torch.testing.assert_close(traced(x), expected, atol=2e-6, rtol=0)
    torch.testing.assert_close(torch.func.grad(lambda t: tanh_rational(t).square().sum())(x), expected, atol=2e-6,
                               rtol=0)
