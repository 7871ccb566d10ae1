"""dpaudit.lazy: heavy stacks bound at module top but imported on first use; torch modules built on first use and picklable."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys

import pytest
import torch

from dpaudit import lazy
from dpaudit.mechanisms.mixmin import tasks as mixmin_tasks
from dpaudit.mechanisms.dpsgd import models

STAND_IN = """
import json, sys
from dpaudit.lazy import lazy_import
special = lazy_import("scipy.special")
before = ["scipy" in sys.modules, type(special).__name__]
value = float(special.xlogy(2.0, 3.0))  # the first use imports scipy.special and rebinds the global
print(json.dumps(before + [value, special is sys.modules["scipy.special"], lazy_import("scipy.special") is special]))
"""


def test_a_stand_in_imports_on_first_use_and_then_is_the_module():
    out = subprocess.run(
        [sys.executable, "-c", STAND_IN], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [
        False,
        "_StandIn",
        2.0 * float(torch.log(torch.tensor(3.0, dtype=torch.float64))),
        True,
        True,
    ]


def test_only_the_heavy_stacks_are_deferred():
    with pytest.raises(ValueError, match="heavy stacks"):
        lazy.lazy_import("json")
    assert lazy.lazy_import("torch") is torch  # already imported: the module itself


@pytest.mark.parametrize("name", ["Dense", "CNN2d", "CNN1d", "CompactAttention"])
def test_torch_module_classes_are_importable_by_name(name):
    cls = getattr(models, name)
    assert (
        issubclass(cls, torch.nn.Module)
        and cls.__module__ == "dpaudit.mechanisms.dpsgd.models"
        and cls.__qualname__ == name
    )
    assert pickle.loads(pickle.dumps(cls)) is cls
    with pytest.raises(AttributeError):
        models.NotAModel  # noqa: B018


def test_built_modules_round_trip_through_torch_save():
    m = models.build_module("cnn", kind="tabular", n_features=7, n_classes=2, seed=3)
    assert type(m) is models.CNN1d
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert type(back) is models.CNN1d and all(
        torch.equal(a, b) for a, b in zip(m.state_dict().values(), back.state_dict().values())
    )
    mlp = mixmin_tasks.new_mlp(4, 3, 2, 5, 1)
    assert type(pickle.loads(pickle.dumps(mlp))) is mixmin_tasks.MLP
