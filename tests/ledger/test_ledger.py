"""Ledger API: recording, composition over the partition tree, caps, voids, fail-closed cases.

Expected epsilons come from calling the accountants directly on hand-built event trees
(independent of the ledger's own tree building).
"""

from __future__ import annotations

import math
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpaudit.accounting import Composed, Parallel, PureEpsilon, SubsampledGaussian, compute_epsilon
from dpaudit.ledger.book import (
    Ledger,
    canonical_json,
    entry_hash,
    latest_schema_version,
    open_ledger,
)
from dpaudit.ledger.paths import resolve_ledger
from dpaudit.errors import (
    AdjacencyMismatchError,
    BudgetExceededError,
    LedgerAuthorityError,
    LedgerError,
    UnsupportedEventError,
    UsageError,
)
from dpaudit.records import Release

SHA = "ab" * 32
# G1 is DP-RVFL's MNIST schedule (q = 0.005, T = 2000, Table 2 of the paper). The tree tests
# use unsubsampled events (closed-form RDP, fast PRV): the tree logic does not depend on q.
G1 = SubsampledGaussian(noise_multiplier=0.9, sample_rate=0.005, steps=2000)
GC = SubsampledGaussian(noise_multiplier=5.0, sample_rate=1.0, steps=8)
MIX = SubsampledGaussian(noise_multiplier=4.0, sample_rate=1.0, steps=3)
FT = SubsampledGaussian(noise_multiplier=6.0, sample_rate=1.0, steps=10)


def make_release(
    event=G1,
    *,
    partition="train",
    dataset="mnist",
    adjacency="add-remove-record",
    epsilon=2.0,
    delta=1e-5,
    non_private=False,
    mechanism="dp-rvfl",
    **kw,
) -> Release:
    return Release(
        mechanism=mechanism,
        dataset={"name": dataset, "sha256": SHA},
        adjacency=adjacency,
        accountant="rdp",
        epsilon=epsilon,
        delta=delta,
        guarantee={} if event is None else event.to_dict(),
        seed=0,
        noise_source={"kind": "os-entropy"},
        partition=partition,
        non_private=non_private,
        git_commit=None,
        noise_multiplier=getattr(event, "noise_multiplier", None),
        sample_rate=getattr(event, "sample_rate", None),
        steps=getattr(event, "steps", None),
        clipping_norm=1.0,
        **kw,
    )


def rdp(event, delta=1e-5):
    return compute_epsilon(event, delta=delta, accountant="rdp").epsilon


def prv(event, delta=1e-5):
    return compute_epsilon(event, delta=delta, accountant="prv").epsilon


def row(rows, partition, dataset="mnist"):
    (r,) = [r for r in rows if r["dataset"] == dataset and r["partition"] == partition]
    return r


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request, tmp_path):
    """An empty ledger on each backend: the same semantics must hold on both (the PostgreSQL
    one skips visibly without a test server, and fails in CI; see conftest.py)."""
    if request.param == "sqlite":
        target = tmp_path / "sub" / "dir" / "ledger.sqlite"
    else:
        target = request.getfixturevalue("pg_ledger_url")
    with open_ledger(target) as led:
        yield led


# ---------------------------------------------------------------- opening and recording


def test_default_path_comes_from_environment_and_parent_dirs_are_created(tmp_path, monkeypatch):
    target = tmp_path / "a" / "b" / "l.sqlite"
    monkeypatch.setenv("DPAUDIT_LEDGER", str(target))
    assert resolve_ledger().path == target
    with open_ledger() as led:
        assert led.path == target
        assert led.schema_version == latest_schema_version()
        assert led.entries() == []
    assert target.is_file()
    mode = sqlite3.connect(target).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_record_stores_the_release_as_data(ledger):
    rel = make_release()
    eid = ledger.record(rel, artefact_path="/runs/a")
    assert eid == rel.id
    e = ledger.get(eid)
    assert e.kind == "release" and e.dataset == "mnist" and e.seq == 1
    p = e.payload
    assert p["guarantee"] == G1.to_dict()
    assert (p["noise_multiplier"], p["sample_rate"], p["steps"], p["clipping_norm"]) == (
        0.9,
        0.005,
        2000,
        1.0,
    )
    assert (p["epsilon"], p["delta"], p["adjacency"], p["partition"]) == (
        2.0,
        1e-5,
        "add-remove-record",
        "train",
    )
    # The keyed fingerprint of the data, never the plain digest.
    assert p["dataset_fingerprint"] == ledger.fingerprint(SHA) != SHA and "dataset_sha256" not in p
    assert all(SHA not in r[5] for r in ledger.store.rows())
    assert p["artefact_path"] == "/runs/a" and p["dpaudit_version"] == rel.dpaudit_version
    assert ledger.get(eid[:8]).id == eid  # unique prefix


def test_recording_the_identical_release_twice_is_a_no_op_but_a_changed_one_is_refused(ledger):
    rel = make_release()
    assert ledger.record(rel) == ledger.record(rel)
    assert len(ledger.entries()) == 1
    changed = Release.from_dict({**rel.to_dict(), "epsilon": 1.0})
    with pytest.raises(LedgerError, match="already in ledger"):
        ledger.record(changed)
    assert len(ledger.entries()) == 1


@pytest.mark.parametrize(
    "guarantee",
    [
        {},
        {"type": "laplace", "epsilon": 1.0},
        {"type": "subsampled-gaussian"},
        None,
        {"type": "subsampled-gaussian", "noise_multiplier": -1, "sample_rate": 0.1, "steps": 3},
    ],
)
def test_a_guarantee_that_does_not_parse_is_refused_never_counted_as_zero(ledger, guarantee):
    rel = Release.from_dict({**make_release().to_dict(), "guarantee": guarantee})
    with pytest.raises((UnsupportedEventError, UsageError)):
        ledger.record(rel)
    assert ledger.entries() == []


def test_bad_names_are_refused(ledger):
    with pytest.raises(UsageError, match="dataset name must be"):
        ledger.record(make_release(dataset=""))
    with pytest.raises(UsageError, match="partition must be"):
        ledger.record(make_release(partition="train mix"))


# ---------------------------------------------------------------- sequential composition


def test_two_identical_gaussian_releases_compose_to_the_doubled_step_count_not_the_sum(ledger):
    ledger.record(make_release())
    ledger.record(make_release())
    r = row(ledger.summary(), "train")
    doubled = SubsampledGaussian(G1.noise_multiplier, G1.sample_rate, 2 * G1.steps)
    assert r["epsilon_rdp"] == pytest.approx(rdp(doubled), rel=1e-12)
    assert r["epsilon_prv"] == pytest.approx(
        compute_epsilon(doubled, delta=1e-5, accountant="prv").epsilon, rel=1e-9
    )
    single = rdp(G1)
    assert r["epsilon_rdp"] < 2 * single - 0.5  # far below the sum of the two
    assert r["naive_epsilon"] == 4.0 and r["releases"] == 2
    assert r["epsilon"] == min(r["epsilon_rdp"], r["epsilon_prv"])
    assert r["epsilon_pure"] is None


def test_pure_releases_sum_and_the_headline_is_the_smallest_valid_bound(ledger):
    ledger.record(make_release(PureEpsilon(0.5), epsilon=0.5, delta=0.0, mechanism="dp-elm"))
    ledger.record(
        make_release(PureEpsilon(0.3, count=2), epsilon=0.6, delta=0.0, mechanism="dp-elm")
    )
    r = row(ledger.summary(), "*")
    assert r["epsilon_pure"] == pytest.approx(1.1)
    assert r["epsilon_rdp"] == pytest.approx(rdp(Composed((PureEpsilon(0.5), PureEpsilon(0.3, 2)))))
    assert r["epsilon"] == min(r["epsilon_pure"], r["epsilon_rdp"], r["epsilon_prv"])
    assert r["naive_epsilon"] == pytest.approx(1.1)


def test_mixed_pure_and_gaussian_releases_use_rdp_and_prv(ledger):
    ledger.record(make_release(GC))
    ledger.record(make_release(PureEpsilon(0.5), epsilon=0.5, delta=0.0))
    r = row(ledger.summary(), "train")
    ref = Composed((GC, PureEpsilon(0.5)))
    assert r["epsilon_rdp"] == pytest.approx(rdp(ref), rel=1e-12)
    assert r["epsilon_prv"] == pytest.approx(
        compute_epsilon(ref, delta=1e-5, accountant="prv").epsilon, rel=1e-9
    )
    assert r["epsilon_pure"] is None


def test_undeclared_partitions_compose_sequentially_in_the_dataset_total(ledger):
    ledger.record(make_release(GC, partition="train"))
    ledger.record(make_release(FT, partition="test"))
    rows = ledger.summary(accountants=("rdp",))
    assert row(rows, "*")["epsilon_prv"] is None  # not asked for
    assert row(rows, "*")["epsilon_rdp"] == pytest.approx(rdp(Composed((GC, FT))), rel=1e-12)
    assert row(rows, "train")["epsilon_rdp"] == pytest.approx(rdp(GC), rel=1e-12)
    # Declaring them disjoint now would lower what they spent: refused, naming both.
    with pytest.raises(
        LedgerAuthorityError, match="must be declared before its children hold releases"
    ) as ei:
        ledger.declare_partition("mnist", "all", ["train", "test"], "prepare-split")
    assert "mnist:train" in str(ei.value) and "mnist:test" in str(ei.value)
    assert row(ledger.summary(accountants=("rdp",)), "*")["epsilon_rdp"] == pytest.approx(
        rdp(Composed((GC, FT))), rel=1e-12
    )
    assert [e.kind for e in ledger.entries()] == ["release", "release"]


def test_partitions_declared_disjoint_before_their_releases_compose_as_the_worst(ledger):
    ledger.declare_partition("mnist", "all", ["train", "test"], "prepare-split")
    ledger.record(make_release(GC, partition="train"))
    ledger.record(make_release(FT, partition="test"))
    rows = ledger.summary(accountants=("rdp",))
    assert row(rows, "*")["epsilon_rdp"] == pytest.approx(max(rdp(GC), rdp(FT)), rel=1e-12)
    assert (
        row(rows, "all")["children"] == ["train", "test"] and row(rows, "train")["parent"] == "all"
    )
    # Re-declaring the identical split stays a no-op, releases or not.
    first = ledger.entries(kind="partition")[0].id
    assert ledger.declare_partition("mnist", "all", ["test", "train"], "prepare-split") == first


def test_a_release_inside_a_child_also_blocks_a_late_declaration(ledger):
    ledger.record(make_release(GC, partition="train/mix/a"))
    with pytest.raises(LedgerAuthorityError, match="train/mix/a"):
        ledger.declare_partition("mnist", "train", ["train/mix", "train/ft"], "dp-mixmin")
    # A release on the parent itself composes sequentially either way: no refusal.
    ledger.record(make_release(GC, partition="other"))
    ledger.declare_partition("mnist", "other/x", ["other/x/1", "other/x/2"], "split")


# ---------------------------------------------------------------- parallel composition


def test_disjoint_children_compose_as_the_worst_child_and_parent_releases_add_sequentially(ledger):
    ledger.record(make_release(GC))
    ledger.record(make_release(GC))
    ledger.declare_partition("mnist", "train", ["train/mix", "train/ft"], "dp-mixmin")
    ledger.record(make_release(MIX, partition="train/mix", mechanism="dp-mixmin-mix"))
    ledger.record(make_release(FT, partition="train/ft", mechanism="dp-mixmin-ft"))
    rows = ledger.summary(accountants=("rdp",))
    two = SubsampledGaussian(GC.noise_multiplier, GC.sample_rate, 2 * GC.steps)
    expected_train = max(rdp(Composed((two, MIX))), rdp(Composed((two, FT))))
    assert row(rows, "train")["epsilon_rdp"] == pytest.approx(expected_train, rel=1e-12)
    assert row(rows, "train")["epsilon_rdp"] == pytest.approx(
        rdp(Composed((two, Parallel((MIX, FT))))), rel=1e-12
    )
    assert row(rows, "train/mix")["epsilon_rdp"] == pytest.approx(rdp(MIX), rel=1e-12)
    assert row(rows, "train/ft")["epsilon_rdp"] == pytest.approx(rdp(FT), rel=1e-12)
    assert row(rows, "*")["epsilon_rdp"] == row(rows, "train")["epsilon_rdp"]
    # Parallel is strictly better than pretending the split was sequential.
    assert row(rows, "train")["epsilon_rdp"] < rdp(Composed((two, MIX, FT)))
    assert row(rows, "train")["releases"] == 2 and row(rows, "train")["releases_subtree"] == 4
    assert row(rows, "train")["naive_epsilon"] == 6.0  # 2 + 2 + max(2, 2)
    assert [r["partition"] for r in rows] == ["*", "train", "train/mix", "train/ft"]


def test_partition_declarations_are_validated(ledger):
    eid = ledger.declare_partition("mnist", "train", ["train/mix", "train/ft"], "dp-mixmin")
    assert (
        ledger.declare_partition("mnist", "train", ["train/ft", "train/mix"], "dp-mixmin") == eid
    )  # identical: no-op
    assert len(ledger.entries()) == 1
    with pytest.raises(UsageError, match="split only once"):
        ledger.declare_partition("mnist", "train", ["train/a", "train/b"], "x")
    with pytest.raises(UsageError, match="one parent"):
        ledger.declare_partition("mnist", "other", ["train/mix"], "x")
    with pytest.raises(UsageError, match="ancestor"):
        ledger.declare_partition("mnist", "train/mix", ["train"], "x")
    with pytest.raises(UsageError, match="distinct"):
        ledger.declare_partition("mnist", "a", ["b", "b"], "x")
    with pytest.raises(UsageError, match="declared_by"):
        ledger.declare_partition("mnist", "a", ["b"], " ")
    with pytest.raises(UsageError, match="at least one"):
        ledger.declare_partition("mnist", "a", [], "x")
    assert len(ledger.entries()) == 1


# ---------------------------------------------------------------- fail closed


def test_a_non_private_release_makes_the_budget_unbounded_not_zero(ledger):
    ledger.declare_partition("mnist", "train", ["train/mix", "train/ft"], "dp-mixmin")
    ledger.record(make_release(MIX, partition="train/mix"))
    ledger.record(
        make_release(
            None, partition="train/ft", non_private=True, epsilon=math.inf, mechanism="rvfl"
        )
    )
    rows = ledger.summary()
    for p in ("*", "train", "train/ft"):
        assert row(rows, p)["epsilon"] == math.inf and row(rows, p)["unbounded"] is True
        assert row(rows, p)["naive_epsilon"] == math.inf
    assert row(rows, "train/mix")["epsilon"] < math.inf and not row(rows, "train/mix")["unbounded"]
    assert row(rows, "*")["non_private_releases"] == 1
    ledger.preflight(
        dataset="mnist", partition="train/mix", event=MIX, adjacency="add-remove-record"
    )  # no cap
    ledger.cap("mnist", 8.0, 1e-5)
    with pytest.raises(BudgetExceededError, match="inf"):
        ledger.preflight(
            dataset="mnist", partition="test", event=MIX, adjacency="add-remove-record"
        )


def test_different_adjacency_on_one_dataset_is_an_error_naming_both(ledger):
    ledger.record(make_release())
    with pytest.raises(AdjacencyMismatchError, match="add-remove-record vs replace-record"):
        ledger.record(make_release(adjacency="replace-record"))
    with pytest.raises(AdjacencyMismatchError, match="add-remove-record vs add-remove-user"):
        ledger.preflight(dataset="mnist", partition="train", event=GC, adjacency="add-remove-user")
    assert len(ledger.entries()) == 1
    ledger.record(
        make_release(adjacency="replace-record", dataset="cardio")
    )  # another dataset is fine


def _rewrite_payload(path, seq, change):
    """Simulate a buggy writer: change a stored payload and re-hash the chain so it verifies."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER entries_no_update")
    rows = conn.execute(
        "SELECT seq, id, kind, created_at, dataset, payload FROM entries ORDER BY seq"
    ).fetchall()
    prev = "0" * 64
    for s, eid, kind, created, ds, text in rows:
        if s == seq:
            text = canonical_json(change(__import__("json").loads(text)))
        h = entry_hash(prev, eid, kind, created, ds, text)
        conn.execute(
            "UPDATE entries SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?",
            (text, prev, h, s),
        )
        prev = h
    conn.execute("UPDATE chain_head SET hash = ?", (prev,))
    conn.close()


def test_a_stored_guarantee_that_cannot_be_parsed_is_an_error_never_zero(tmp_path):
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as led:
        led.record(make_release())
    _rewrite_payload(path, 1, lambda p: {**p, "guarantee": {"type": "mystery"}})
    with open_ledger(path) as led:
        with pytest.raises(UnsupportedEventError, match="mystery"):
            led.summary()
        with pytest.raises(UnsupportedEventError):
            led.preflight(
                dataset="mnist", partition="train", event=G1, adjacency="add-remove-record"
            )
        rep = led.verify()
        assert not rep.ok
        assert [(p.kind, p.seq) for p in rep.problems if p.kind != "schema"] == [("unreadable", 1)]


# ---------------------------------------------------------------- voids


def test_void_withdraws_a_release_without_deleting_it(ledger):
    a = ledger.record(make_release(GC))
    b = ledger.record(make_release(GC))
    before = row(ledger.summary(accountants=("rdp",)), "train")["epsilon_rdp"]
    vid = ledger.void(b[:10], "recorded twice by mistake", published=False)
    after = row(ledger.summary(accountants=("rdp",)), "train")
    assert (
        after["epsilon_rdp"] == pytest.approx(rdp(GC), rel=1e-12) and after["epsilon_rdp"] < before
    )
    assert (
        after["releases"] == 1
        and row(ledger.summary(accountants=("rdp",)), "*")["voided_releases"] == 1
    )
    assert ledger.get(b).voided_by == vid and ledger.get(a).voided_by is None
    assert ledger.get(vid).payload == {
        "target": b,
        "reason": "recorded twice by mistake",
        "artefacts_published": False,
    }
    assert [e.kind for e in ledger.entries()] == ["release", "release", "void"]
    with pytest.raises(UsageError, match="voided already"):
        ledger.void(b, "again")
    with pytest.raises(UsageError, match="must be a release"):
        ledger.void(vid, "a void")
    with pytest.raises(UsageError, match="reason must be"):
        ledger.void(a, "")
    with pytest.raises(UsageError, match="entry id must be"):
        ledger.void("nope", "x")
    assert ledger.verify().ok


# ---------------------------------------------------------------- caps and the pre-check


def test_cap_validation_and_latest_cap_wins(ledger):
    with pytest.raises(UsageError, match="epsilon must be a finite number > 0"):
        ledger.cap("mnist", 0.0, 1e-5)
    with pytest.raises(UsageError, match="delta must be in the open interval"):
        ledger.cap("mnist", 1.0, 1.0)
    ledger.record(make_release(GC))
    ledger.cap("mnist", 3.0, 1e-5)
    ledger.cap("mnist", 5.0, 1e-6)
    r = row(ledger.summary(accountants=("rdp",)), "*")
    assert (
        r["cap"] == {"epsilon": 5.0, "delta": 1e-6, "include_audits": True} and r["delta"] == 1e-6
    )  # caps count audits by default
    assert r["epsilon_rdp"] == pytest.approx(rdp(GC, delta=1e-6), rel=1e-12)
    assert r["remaining"] == pytest.approx(5.0 - r["epsilon"])


def test_preflight_refuses_exactly_when_the_composed_total_would_exceed_the_cap(ledger):
    ledger.record(make_release())
    ledger.preflight(
        dataset="mnist", partition="train", event=G1, adjacency="add-remove-record"
    )  # no cap: passes
    two = SubsampledGaussian(G1.noise_multiplier, G1.sample_rate, 2 * G1.steps)
    total = min(rdp(two), compute_epsilon(two, delta=1e-5, accountant="prv").epsilon)
    ledger.cap("mnist", total, 1e-5)
    ledger.preflight(
        dataset="mnist", partition="train", event=G1, adjacency="add-remove-record"
    )  # exactly at cap
    ledger.cap("mnist", total * (1 - 1e-9), 1e-5)
    with pytest.raises(BudgetExceededError) as ei:
        ledger.preflight(
            dataset="mnist", partition="train", event=G1, adjacency="add-remove-record"
        )
    msg = str(ei.value)
    assert (
        "already spent epsilon=" in msg
        and "needs epsilon=" in msg
        and "cap epsilon=" in msg
        and "\n" not in msg
    )
    assert f"{total:.4f}" in msg
    check = ledger.check(
        dataset="mnist", partition="train", event=G1, adjacency="add-remove-record"
    )
    assert check["allowed"] is False and check["total"] == pytest.approx(total)
    assert len(ledger.entries(kind="release")) == 1  # the pre-check writes nothing


def test_preflight_follows_the_partition_tree(ledger):
    ledger.declare_partition("mnist", "train", ["train/mix", "train/ft"], "dp-mixmin")
    ledger.record(make_release(FT, partition="train/ft"))
    # Cap between the parallel and the sequential composition of FT and MIX (each the
    # smallest of the rdp and prv bounds, as the ledger uses): a parallel sibling fits ...
    par_total = min(rdp(Parallel((FT, MIX))), prv(Parallel((FT, MIX))))
    seq_total = min(rdp(Composed((FT, MIX))), prv(Composed((FT, MIX))))
    assert par_total < seq_total
    ledger.cap("mnist", (par_total + seq_total) / 2, 1e-5)
    ledger.preflight(
        dataset="mnist",
        partition="train/mix",
        event=MIX,
        adjacency="add-remove-record",
        data_digest=SHA,
    )
    # ... but the same release on the same child, on the parent, or on an undeclared partition does not.
    for part in ("train/ft", "train", "test"):
        with pytest.raises(BudgetExceededError):
            ledger.preflight(
                dataset="mnist",
                partition=part,
                event=MIX,
                adjacency="add-remove-record",
                data_digest=SHA,
            )
    # Without the data's digest the planned release may be on other records: the split of the
    # recorded data says nothing about it, so it composes sequentially (fail closed).
    with pytest.raises(BudgetExceededError):
        ledger.preflight(
            dataset="mnist", partition="train/mix", event=MIX, adjacency="add-remove-record"
        )


def test_releasing_preflight_and_publish_go_through_the_ledger(tmp_path):
    from dpaudit.releasing import preflight, publish

    path = tmp_path / "l.sqlite"
    rel = make_release()
    publish(rel, tmp_path / "run", ledger_path=path)
    with open_ledger(path) as led:
        assert led.get(rel.id).payload["artefact_path"] == str((tmp_path / "run").resolve())
        led.cap("mnist", 2.0, 1e-5)
    with pytest.raises(BudgetExceededError):
        preflight(
            dataset="mnist",
            partition="train",
            event=G1,
            adjacency="add-remove-record",
            ledger_path=path,
        )


# ---------------------------------------------------------------- invariants

_events = st.builds(
    SubsampledGaussian,
    noise_multiplier=st.sampled_from([0.7, 1.0, 2.0]),
    sample_rate=st.just(1.0),
    steps=st.integers(1, 300),
)
_parts = st.sampled_from(["train", "train/mix", "train/ft", "test"])


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=st.lists(st.tuples(_events, _parts), min_size=1, max_size=4), declare=st.booleans())
def test_more_releases_never_lower_any_total_and_no_row_exceeds_the_dataset(
    tmp_path_factory, plan, declare
):
    path = tmp_path_factory.mktemp("inv") / "l.sqlite"
    with open_ledger(path) as led:
        if declare:
            led.declare_partition("mnist", "train", ["train/mix", "train/ft"], "dp-mixmin")
        prev_total = 0.0
        for ev, part in plan:
            led.record(make_release(ev, partition=part))
            rows = led.summary(accountants=("rdp",))
            total = row(rows, "*")["epsilon_rdp"]
            assert total >= prev_total - 1e-12
            assert all(r["epsilon_rdp"] <= total + 1e-12 for r in rows)
            prev_total = total
        # The fully sequential composition of every release is never below the ledger's total.
        assert total <= rdp(Composed(tuple(ev for ev, _ in plan))) + 1e-12
        assert led.verify().ok


def test_ledger_class_is_usable_without_the_helper(tmp_path):
    with Ledger(tmp_path / "x.sqlite") as led:
        led.cap("toy", 1.0, 1e-5)
        assert led.verify().ok and led.verify().entries == 1


def test_a_path_names_containment_and_undeclared_subsets_compose_sequentially(ledger):
    # As the DP-MixMin pipeline records: a keyed split "train/mixmin-keyed-..." of train, declared
    # disjoint into /mix and /ft, next to DP-RVFL releases on train and an undeclared subset of
    # train. (Old "train/mixmin-rho..." splits are not honoured: test_ledger_old_mixmin_split.py.)
    split = "train/mixmin-keyed-bernoulli-v1-rho0.1-seed42"
    ledger.record(make_release(GC))
    ledger.declare_partition("mnist", split, [split + "/mix", split + "/ft"], "dp-mixmin")
    ledger.record(make_release(MIX, partition=split + "/mix"))
    ledger.record(make_release(FT, partition=split + "/ft"))
    ledger.record(make_release(FT, partition="train/other"))
    rows = ledger.summary(accountants=("rdp",))
    assert [r["partition"] for r in rows] == [
        "*",
        "train",
        split,
        split + "/mix",
        split + "/ft",
        "train/other",
    ]
    assert row(rows, split)["parent"] == "train" and row(rows, "train")["subsets"] == [
        split,
        "train/other",
    ]
    expected = rdp(Composed((GC, FT, Parallel((MIX, FT)))))
    assert row(rows, "train")["epsilon_rdp"] == pytest.approx(expected, rel=1e-12)
    assert row(rows, "*")["epsilon_rdp"] == row(rows, "train")["epsilon_rdp"]
    assert row(rows, "train")["releases_subtree"] == 4
    with pytest.raises(UsageError, match="ancestor"):
        ledger.declare_partition("mnist", split + "/mix/a", ["train"], "x")


def test_an_accountant_that_fails_is_skipped_with_its_reason_and_never_lowers_the_bound(
    ledger, monkeypatch
):
    from dpaudit.ledger import compose as ledger_compose

    ledger.record(make_release(GC))
    real = ledger_compose.compute_epsilon

    def flaky(event, *, delta, accountant, adjacency):
        if accountant == "prv":
            raise FloatingPointError("prv blew up")
        return real(event, delta=delta, accountant=accountant, adjacency=adjacency)

    monkeypatch.setattr(ledger_compose, "compute_epsilon", flaky)
    monkeypatch.setattr(ledger_compose, "_CACHE", ledger_compose.OrderedDict())
    r = row(ledger.summary(), "*")
    assert r["epsilon_prv"] is None and r["accountant_errors"] == {"prv": "prv blew up"}
    assert r["epsilon"] == r["epsilon_rdp"] == pytest.approx(rdp(GC)) and r["bound_by"] == "rdp"

    def broken(event, *, delta, accountant, adjacency):
        raise FloatingPointError(f"{accountant} blew up")

    monkeypatch.setattr(ledger_compose, "compute_epsilon", broken)
    monkeypatch.setattr(ledger_compose, "_CACHE", ledger_compose.OrderedDict())
    with pytest.raises(UnsupportedEventError, match="no accountant could bound"):
        ledger.summary()


def test_composition_order_is_canonical_and_failures_are_cached(monkeypatch):
    """A dataset total and its only partition hold the same releases in a different order: one
    canonical event, so one accountant call; a failing accountant is not re-run either."""
    from dpaudit.ledger import compose as lc

    a, b = SubsampledGaussian(2.0, 0.01, 100), SubsampledGaussian(1.0, 0.02, 50)
    assert (
        lc.sequential([a, b])
        == lc.sequential([b, Composed((a,))])
        == lc.sequential([Composed((b, a))])
    )
    assert lc.sequential([a, a]) == lc.sequential(
        [SubsampledGaussian(2.0, 0.01, 200)]
    )  # merged: steps add

    calls = []

    def failing(event, **kw):
        calls.append(kw["accountant"])
        raise UnsupportedEventError("prv says no")

    monkeypatch.setattr(lc, "compute_epsilon", failing)
    monkeypatch.setattr(lc, "_CACHE", lc.OrderedDict())
    for _ in range(3):
        with pytest.raises(UnsupportedEventError, match="prv says no"):
            lc._cached_epsilon(lc.sequential([a, b]), 1e-5, "prv", "add-remove-record")
    assert calls == ["prv"]


def test_planned_noise_tail_counts_in_the_check_and_is_held_by_the_reservation(ledger):
    """The planned run's sampler tail delta (dpaudit.noise) enters the cap check and the
    reservation, as the release's will once recorded: a cap that the event alone meets is
    refused when the tail eats into its delta."""
    ledger.cap("mnist", 10.0, 1e-5)
    plain = ledger.check(
        dataset="mnist", partition="train", event=G1, adjacency="add-remove-record"
    )
    with_tail = ledger.check(
        dataset="mnist",
        partition="train",
        event=G1,
        adjacency="add-remove-record",
        noise_tail_delta=1e-9,
    )
    assert with_tail["total"] > plain["total"]  # epsilon at the delta left after the tail
    ledger.cap("mnist", (plain["total"] + with_tail["total"]) / 2, 1e-5)
    ledger.preflight(dataset="mnist", partition="train", event=G1, adjacency="add-remove-record")
    with pytest.raises(BudgetExceededError):
        ledger.preflight(
            dataset="mnist",
            partition="train",
            event=G1,
            adjacency="add-remove-record",
            noise_tail_delta=1e-9,
        )
    with pytest.raises(UsageError, match="noise_tail_delta"):
        ledger.check(
            dataset="mnist",
            partition="train",
            event=G1,
            adjacency="add-remove-record",
            noise_tail_delta=-1.0,
        )
    ledger.cap("mnist", 10.0, 1e-5)
    ledger.reserve(
        dataset="mnist",
        partition="train",
        event=G1,
        adjacency="add-remove-record",
        noise_tail_delta=1e-9,
    )
    after = ledger.check(
        dataset="mnist", partition="train", event=None, adjacency="add-remove-record"
    )
    entry = [e for e in ledger.entries(dataset="mnist") if e.kind == "reservation"][-1]
    assert entry.payload["noise_tail_delta"] == 1e-9
    assert after["spent"] == pytest.approx(with_tail["total"], rel=1e-12)
