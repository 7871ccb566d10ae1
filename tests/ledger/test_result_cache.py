"""The on-disk memo of prv answers used by `dpaudit ledger summary` (ledger/result_cache.py)."""

from __future__ import annotations

import json

import pytest

from dpaudit.accounting import SubsampledGaussian, compute_epsilon
from dpaudit.ledger import compose as ledger_compose
from dpaudit.ledger import result_cache
from dpaudit.ledger.book import open_ledger
from dpaudit.errors import UnsupportedEventError

EVENT = SubsampledGaussian(1.1, 0.01, 300)
ADJ = "add-remove-record"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def prv_result():
    return compute_epsilon(EVENT, delta=1e-5, accountant="prv", adjacency=ADJ)


def test_off_unless_enabled(cache_dir, prv_result):
    result_cache.store(EVENT, 1e-5, "prv", ADJ, prv_result)
    assert not (cache_dir / "prv_results.json").exists()
    with result_cache.enabled():
        result_cache.store(EVENT, 1e-5, "prv", ADJ, prv_result)
    assert result_cache.lookup(EVENT, 1e-5, "prv", ADJ) is None  # disabled again
    with result_cache.enabled():
        assert result_cache.lookup(EVENT, 1e-5, "prv", ADJ) == prv_result


def test_exact_key(cache_dir, prv_result):
    with result_cache.enabled():
        result_cache.store(EVENT, 1e-5, "prv", ADJ, prv_result)
        assert result_cache.lookup(EVENT, 1e-5, "prv", ADJ) == prv_result
        for event, delta, acc, adj in [
            (SubsampledGaussian(1.1, 0.01, 301), 1e-5, "prv", ADJ),
            (EVENT, 1.0000001e-5, "prv", ADJ),
            (EVENT, 1e-5, "prv", "add-remove-user"),
            (EVENT, 1e-5, "rdp", ADJ),
            (EVENT, 1e-5, "pld", ADJ),
        ]:
            assert result_cache.lookup(event, delta, acc, adj) is None
        result_cache.store(
            EVENT, 1e-5, "rdp", ADJ, compute_epsilon(EVENT, delta=1e-5, accountant="rdp")
        )
        assert result_cache.lookup(EVENT, 1e-5, "rdp", ADJ) is None  # rdp is always recomputed


def test_edited_or_damaged_entries_are_ignored(cache_dir, prv_result):
    path = cache_dir / "prv_results.json"
    with result_cache.enabled():
        result_cache.store(EVENT, 1e-5, "prv", ADJ, prv_result)
        data = json.loads(path.read_text())
        (entry,) = data["entries"].values()
        entry["value"]["epsilon"] = (
            prv_result.epsilon / 2
        )  # an under-report, without a matching check
        path.write_text(json.dumps(data))
        assert result_cache.lookup(EVENT, 1e-5, "prv", ADJ) is None
        path.write_text(path.read_text()[:40])  # half a file
        assert result_cache.lookup(EVENT, 1e-5, "prv", ADJ) is None
        result_cache.store(EVENT, 1e-5, "prv", ADJ, prv_result)  # rewritten whole
        assert result_cache.lookup(EVENT, 1e-5, "prv", ADJ) == prv_result


def test_refusals_are_kept_other_failures_are_not(cache_dir):
    with result_cache.enabled():
        result_cache.store(EVENT, 1e-5, "prv", ADJ, FloatingPointError("blew up"))
        assert result_cache.lookup(EVENT, 1e-5, "prv", ADJ) is None
        result_cache.store(EVENT, 1e-5, "prv", ADJ, UnsupportedEventError("prv says no."))
        got = result_cache.lookup(EVENT, 1e-5, "prv", ADJ)
        assert isinstance(got, UnsupportedEventError) and str(got) == "prv says no."


def test_summary_from_the_cache_equals_the_computed_one(cache_dir, tmp_path, monkeypatch):
    from dpaudit.records import Release

    with open_ledger(tmp_path / "l.sqlite") as led:
        for i, ev in enumerate((EVENT, SubsampledGaussian(2.0, 1.0, 4))):
            rel = Release(
                mechanism="dp-rvfl",
                dataset={"name": "mnist", "sha256": "cd" * 32},
                adjacency=ADJ,
                accountant="rdp",
                epsilon=9.0,
                delta=1e-5,
                guarantee=ev.to_dict(),
                seed=3,
                noise_source={"kind": "os-entropy"},
                partition="train",
                git_commit=None,
            )
            led.record(rel)
        plain = led.summary()
        monkeypatch.setattr(ledger_compose, "_CACHE", ledger_compose.OrderedDict())
        with result_cache.enabled():
            first = led.summary()
        real = ledger_compose.compute_epsilon

        def no_prv(event, *, delta, accountant, adjacency):
            assert accountant != "prv", "prv must come from the cache"
            return real(event, delta=delta, accountant=accountant, adjacency=adjacency)

        monkeypatch.setattr(ledger_compose, "compute_epsilon", no_prv)
        monkeypatch.setattr(ledger_compose, "_CACHE", ledger_compose.OrderedDict())
        with result_cache.enabled():
            second = led.summary()
    assert plain == first == second
    assert second[0]["epsilon_prv"] is not None
