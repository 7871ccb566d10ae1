"""An audit from a MixMin release rebuilds D_mix; it must refuse a release whose split it cannot rebuild."""

import pytest

from dpaudit.auditing import target_from_release
from dpaudit.errors import DataError
from dpaudit.records import Release


def _release(split):
    config = {"task": "digits-mix", "stage": "mixture", "rho": 0.1}
    if split is not None:
        config["split"] = split
    return Release(
        mechanism="dp-mixmin",
        dataset={"name": "digits-mix"},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee={
            "type": "subsampled-gaussian",
            "noise_multiplier": 1.0,
            "sample_rate": 0.5,
            "steps": 10,
        },
        seed=42,
        noise_source={"source": "os-entropy"},
        noise_multiplier=1.0,
        sample_rate=0.5,
        steps=10,
        clipping_norm=1.0,
        normalizer=10,
        config=config,
    )


@pytest.mark.parametrize("split", [None, {"rule": "caller-supplied"}, {"rule": "permutation"}])
def test_a_release_whose_mixture_split_is_not_the_keyed_rule_is_refused(split):
    # An old release (no rule recorded: the unstable permutation split) or a caller-supplied
    # split would be audited on other records than the release was trained on.
    with pytest.raises(DataError, match="split rule must be 'keyed-bernoulli-v1'"):
        target_from_release(_release(split))
