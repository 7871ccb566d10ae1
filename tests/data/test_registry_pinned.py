"""The registry's entries and the bundled datasets' prepared data, rows and description are pinned:
a restructuring of the registry or its loaders must leave them bit-identical (values taken from the
code before the registry derived its entries' classes, profiles and file needs from their kind)."""

import hashlib
import json

import pytest

from dpaudit.data import DATASETS, load_dataset


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_registry_entries_are_pinned():
    table = json.dumps({n: i.to_dict() for n, i in DATASETS.items()}, sort_keys=True)
    assert _sha(table) == "e3ee53fb3ab24c29e846c4de5579db33391190d848d31f1bcc7d7927cab7d1ff"


@pytest.mark.parametrize(
    "name, profile, data, rows, described",
    [
        (
            "digits",
            "raw01",
            "c8a8620d2cd777b2dadf2cd285e413ad77cbe90f8a9e7a7f72a3f7cbde612572",
            "5fc3ceed2877707e85667c3db669d0767c79e00bf3c2004d612a57dbe887e6b0",
            "403ec8cc256fd02d5feb527d310999458cd9a1aed849b34d96f8045f4a8e8084",
        ),
        (
            "digits",
            "centered",
            "fd02c5d4efb338a1074fdc46d08b898e98c89cbf1cb9a7e02a15a488d1d64cb8",
            "5fc3ceed2877707e85667c3db669d0767c79e00bf3c2004d612a57dbe887e6b0",
            "9f5c160b689a5d49d4015cb576fdd95c58d9b428303271e3ef56f29aca656ec7",
        ),
        (
            "breast-cancer",
            None,
            "d72b2419c70b10344ee2b5078d17b8fc80e66178b82bfaf86edcaf18d5cd5c6d",
            "9eda034881197232572f6932cb01610e9450212e08fb302f98b5c79c7a0beee5",
            "0b2212d40b1069351cc3574d2cda97a8262bdf1922737f69eb546ffe10ee33e2",
        ),
    ],
)
def test_bundled_dataset_is_pinned(name, profile, data, rows, described):
    ds = load_dataset(name, profile=profile, split_seed=7)
    assert ds.sha256 == data
    assert _sha(repr(ds.rows)) == rows
    fields = [ds.identity(), ds.notes, ds.feature_names, ds.image_shape, ds.reference_size]
    assert _sha(json.dumps([*fields, ds.profile], sort_keys=True)) == described
