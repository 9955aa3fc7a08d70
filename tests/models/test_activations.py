"""The tanh layer: torch's tanh to float rounding, by the compiled sigmoid form where no gradient is taken and
torch's tanh is not the fast one."""

import pytest
import torch

from mnar_recsys.models import activations
from mnar_recsys.models.activations import Tanh


@pytest.mark.parametrize("torch_fast", [False, True])
def test_tanh_equals_torchs_to_rounding_in_and_out_of_a_gradient(monkeypatch, torch_fast):
    monkeypatch.setattr(activations, "torch_tanh_is_fast", lambda: torch_fast)
    x = torch.cat([torch.linspace(-30, 30, 20001), torch.tensor([0.0, 1e-30, -1e-30, float("inf"), -float("inf")])])
    with torch.no_grad():
        fast = Tanh()(x)
    torch.testing.assert_close(fast, torch.tanh(x), atol=2.5e-7, rtol=0)
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
        torch.testing.assert_close(Tanh()(x), torch.tanh(x), atol=2.5e-7, rtol=0)
