"""Accounting refusals and fallbacks no other test runs: the prefix a user accountant's reason gets,
a comparison every accountant declines, unregistering an unknown name, the same-relation
conversion, and how Opacus's RDP analysis is loaded when its file cannot be run alone."""

from __future__ import annotations

import sys

import opacus.accountants.analysis.rdp as opacus_rdp
import pytest

from dpaudit.accounting import Adjacency, PureEpsilon, SubsampledGaussian, calibrate
from dpaudit.accounting import compute_epsilon
from dpaudit.accounting import opacus_rdp as loader
from dpaudit.accounting import unregister_accountant
from dpaudit.accounting.accountants import compare, merge_leaves
from dpaudit.accounting.adjacency import convert
from dpaudit.errors import UnsupportedEventError, UsageError

SAMPLED = SubsampledGaussian(1.0, 0.01, 100)


class Terse:
    """A user accountant whose refusal names neither itself nor the adjacency."""

    name, uses_delta = "terse", True

    def support_error(self, event, adjacency):
        return "too many steps\nsecond line"

    def supports(self, event, adjacency):
        return False

    def epsilon(self, event, delta, adjacency):
        raise AssertionError("never asked: the pair is refused first")


def test_a_terse_refusal_is_named_and_every_accountant_declining_is_refused():
    with pytest.raises(UnsupportedEventError) as refused:
        compute_epsilon(SAMPLED, delta=1e-5, accountant=Terse())
    assert str(refused.value) == (
        "the terse accountant does not support subsampled-gaussian events under "
        "add-remove-record adjacency: too many steps"
    )
    with pytest.raises(UnsupportedEventError, match=r"^no accountant could bound this run: rdp: "):
        compare(SAMPLED, delta=1e-5, adjacency=Adjacency.REPLACE_RECORD, names=["rdp", "prv"])


def test_unknown_names_and_the_same_relation():
    with pytest.raises(UsageError, match="accountant must be one of the registered .*'nobody'"):
        unregister_accountant("nobody")
    assert convert(1.5, 1e-5, "replace-record", Adjacency.REPLACE_RECORD) == (1.5, 1e-5)


def test_opacus_analysis_is_imported_when_its_file_cannot_run_alone(monkeypatch):
    standalone = loader._standalone
    package = sys.modules["opacus.accountants.analysis"]
    monkeypatch.setattr(package, "rdp", opacus_rdp)  # restored after the re-import below
    monkeypatch.delitem(sys.modules, loader.OPACUS_RDP)
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader, "_standalone", lambda: 1 / 0)  # a layout we cannot load alone
    imported = loader.analysis()
    assert imported.__name__ == loader.OPACUS_RDP and imported.__file__ == opacus_rdp.__file__
    monkeypatch.setattr(loader, "_module", None)
    monkeypatch.setattr(loader, "_standalone", standalone)
    monkeypatch.delitem(sys.modules, loader.OPACUS_RDP)
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="opacus is not installed"):
        loader.analysis()


def test_nothing_spent_is_epsilon_zero_and_unknown_leaves_are_refused():
    for nothing in (SubsampledGaussian(1.0, 0.01, 0), PureEpsilon(1.0, 0)):
        assert compute_epsilon(nothing, delta=1e-5, accountant="pld").epsilon == 0.0
    with pytest.raises(UnsupportedEventError, match="accountants understand subsampled-gaussian"):
        merge_leaves([SAMPLED, "laplace"])
    with pytest.raises(UsageError, match="make_event must be a callable"):
        calibrate(3.0, target_epsilon=1.0, delta=1e-5)
