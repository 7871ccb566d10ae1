"""Ghost clipping with in-place operations after (or on the input of) a covered layer: the clipped
sums equal the per-example reference (vmap) kernel, or the model is refused in one line naming the layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import core as dpsgd_core, ghost_clip, user_level


class InplaceAfter(nn.Module):
    """nn.ReLU(inplace=True) and an in-place add rewrite the hidden layers' outputs."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act = nn.Linear(5, 7), nn.ReLU(inplace=True)
        self.fc2, self.fc3 = nn.Linear(7, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.act(self.fc1(x))
        h2 = self.fc2(h)
        h2.mul_(0.5).add_(0.1)
        return self.fc3(nn.functional.relu_(h2))


class ConvInplace(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.act, self.fc = (
            nn.Conv2d(1, 3, 3),
            nn.ReLU(inplace=True),
            nn.Linear(3 * 4 * 4, 2),
        )

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).flatten(1))


class InputRewritten(nn.Module):
    """fc2's input is rewritten in place after fc2 read it: its weight gradient needs the value fc2 saw."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(5, 4), nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc1(x)
        out = self.fc2(h)
        h.add_(1.0)
        return out + self.fc3(h)


def _case(module, shape, k, seed=0):
    torch.manual_seed(seed)
    module = module.double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((10, *shape), generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, k, (10,), generator=g)
    return module, {n: p.detach() for n, p in module.named_parameters()}, x, y


@pytest.mark.parametrize("ghost", [True, False])
@pytest.mark.parametrize("make,shape,k", [(InplaceAfter, (5,), 3), (ConvInplace, (1, 6, 6), 2)])
def test_inplace_activations_give_the_reference_sums(monkeypatch, make, shape, k, ghost):
    monkeypatch.setattr(ghost_clip, "_use_ghost", lambda *a: ghost)
    module, params, x, y = _case(make(), shape, k)
    for c in (1e-3, 0.5, 1e3):
        ref = dpsgd_core.per_sample_clipped_sum(module, params, x, y, c)
        ours = ghost_clip.ghost_clipped_sum(module, x, y, c)
        for name in ref:
            torch.testing.assert_close(ours[name], ref[name], rtol=1e-9, atol=1e-12)
    seg = np.array([0, 0, 1, 2, 2, 2, 3, 4, 4, 5])
    ref = user_level.user_module_clipped_sum(
        module, params, x, y, np.arange(10), seg, np.bincount(seg), 0.5
    )
    ours = ghost_clip.ghost_clipped_sum(module, x, y, 0.5, seg=seg, k=np.bincount(seg))
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], rtol=1e-9, atol=1e-12)


def test_a_layer_input_rewritten_in_place_is_refused_naming_the_layer():
    module, params, x, y = _case(InputRewritten(), (5,), 3)
    says = r"^model must not modify a layer's input in place \(ghost clipping\), got fc2's input"
    with pytest.raises(UsageError, match=says):
        ghost_clip.ghost_clipped_sum(module, x, y, 0.5)
