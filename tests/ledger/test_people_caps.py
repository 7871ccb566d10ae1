"""A cap budgets people, not files: it covers every name whose rows meet the rows it declared when
it was set (before any release of its own name), for releases, reservations and audits alike; role
collisions are refused on any declared overlap; a cap is never decided by the on-disk prv cache.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpaudit.accounting import SubsampledGaussian
from dpaudit.accounting.events import PureEpsilon
from dpaudit.cli import app
from dpaudit.data.rows import RowSet
from dpaudit.errors import BudgetExceededError, RowRoleCollisionError
from dpaudit.ledger import compose as lc
from dpaudit.ledger import result_cache
from dpaudit.ledger.book import open_ledger

ADJ = "add-remove-record"
runner = CliRunner()


def _cli_cap(led_path, dataset, eps, *extra, data_dir=None):
    args = [
        "ledger",
        "cap",
        "--dataset",
        dataset,
        "--eps",
        str(eps),
        "--delta",
        "1e-5",
        "--ledger",
        str(led_path),
        "--json",
        *extra,
    ]
    return runner.invoke(app, args + ([] if data_dir is None else ["--data-dir", str(data_dir)]))


def _rows(private, public=(), source="s"):
    out = (RowSet(source, "private", tuple(private)),)
    return out + ((RowSet(source, "public", tuple(public)),) if public else ())


def _release(name, event):
    from dpaudit.records import Release

    return Release(
        mechanism="m",
        dataset={"name": name},
        adjacency=ADJ,
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee=event.to_dict(),
        seed=0,
        noise_source={"kind": "os-entropy"},
        partition="train",
    )


def _reserve(led, name, rows, event):
    return led.reserve(dataset=name, partition="train", event=event, adjacency=ADJ, data_rows=rows)


def test_a_cap_set_before_any_release_covers_heart_mix(data_dir, tmp_path, monkeypatch):
    """`ledger cap --dataset heart` declares heart's rows: heart-mix (same Cleveland patients) is
    charged to heart's cap although heart itself never released anything."""
    from dpaudit.mechanisms.mixmin.tasks import load_task

    led_path = tmp_path / "l.sqlite"
    monkeypatch.setenv("DPAUDIT_DATA_DIR", str(data_dir))
    r = _cli_cap(led_path, "heart", 2)
    assert r.exit_code == 0, r.output
    mix_rows = load_task("heart-mix", data_dir=data_dir).rows
    with open_ledger(led_path) as led:
        _reserve(led, "heart-mix", mix_rows, PureEpsilon(0.8))
        _reserve(led, "heart-mix", mix_rows, PureEpsilon(0.8))
        with pytest.raises(BudgetExceededError, match=r"'heart' exceeded through shared people"):
            _reserve(led, "heart-mix", mix_rows, PureEpsilon(0.8))
        row = next(r for r in led.summary("heart") if r["partition"] == "*")
        assert row["shares_people_with"] == ["heart-mix"] and row["remaining"] == pytest.approx(
            2.0 - 1.6
        )
        assert set(led.entries(kind="cap")[0].payload["rows"]) == {"private", "public"}


def test_a_cap_with_audits_set_before_any_release_covers_other_names_audits(
    data_dir, tmp_path, monkeypatch
):
    """An audit goes through the same people check: heart's cap (with audits) refuses heart-mix audits
    that would take heart's people over it, whether the audit names its rows or not."""
    from dpaudit.mechanisms.mixmin.tasks import load_task

    led_path = tmp_path / "l.sqlite"
    monkeypatch.setenv("DPAUDIT_DATA_DIR", str(data_dir))
    assert _cli_cap(led_path, "heart", 10, "--include-audits").exit_code == 0
    mix_rows = load_task("heart-mix", data_dir=data_dir).rows
    with open_ledger(led_path) as led:

        def audit(i, **kw):
            return led.record_audit(
                audit_id=f"{i:032x}",
                dataset="heart-mix",
                partition="train",
                adjacency=ADJ,
                event=PureEpsilon(4.0),
                trials=1,
                mechanism="dp-rvfl",
                **kw,
            )

        rid = _reserve(led, "heart-mix", mix_rows, PureEpsilon(0.5))
        audit(1)  # rows unknown: every Cleveland row, assumed
        audit(2, release_id=rid)  # the audited reservation's rows
        with pytest.raises(
            BudgetExceededError, match=r"'heart' exceeded through shared people.*audit"
        ):
            audit(3)
        with pytest.raises(
            BudgetExceededError, match=r"'heart' exceeded through shared people.*audit"
        ):
            audit(4, release_id=rid)
        assert len(led.entries(kind="audit")) == 2


def test_a_cap_keeps_the_rows_it_declared(tmp_path):
    """Another name's cap declares the rows its entries read at cap time: withdrawing those entries
    afterwards does not take the cap's people out of its reach."""
    with open_ledger(tmp_path / "l.sqlite") as led:
        rid = _reserve(led, "custom", _rows(range(10)), PureEpsilon(0.5))
        led.cap("custom", 1.0, 1e-5)
        led.cancel(rid, "released nothing")
        _reserve(led, "copy", _rows(range(5, 8)), PureEpsilon(0.6))
        with pytest.raises(BudgetExceededError, match="'custom' exceeded through shared people"):
            _reserve(led, "copy", _rows(range(5, 8)), PureEpsilon(0.6))


def test_cap_of_a_name_whose_rows_cannot_be_known_is_refused(tmp_path):
    led_path = tmp_path / "l.sqlite"
    r = _cli_cap(led_path, "toy", 3)
    assert r.exit_code == 2 and r.stdout == ""
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "dataset must be a built-in dataset or task" in lines[0]
    assert "'toy'" in lines[0]
    with open_ledger(led_path) as led:
        assert led.entries(kind="cap") == []
    r = _cli_cap(led_path, "heart", 3, data_dir=tmp_path / "nowhere")
    assert r.exit_code == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
    with open_ledger(led_path) as led:
        assert led.entries() == []


def test_role_collisions_are_refused_on_any_overlap(tmp_path):
    """A declared "every row" (rows not tracked, e.g. a user re-split) collides with any row read in
    the other role, under another name and inside one release."""
    with open_ledger(tmp_path / "l.sqlite") as led:
        led.reserve(
            dataset="resplit",
            partition="train",
            event=PureEpsilon(0.5),
            adjacency=ADJ,
            data_rows=(RowSet("s", "private", None),),
        )
        with pytest.raises(
            RowRoleCollisionError, match="must not be read as public by dataset 'other'"
        ):
            _reserve(led, "other", _rows(range(100, 110), public=[3]), PureEpsilon(0.5))
        with pytest.raises(RowRoleCollisionError, match="read as both"):
            _reserve(
                led,
                "both",
                (RowSet("t", "private", None), RowSet("t", "public", (1,))),
                PureEpsilon(0.5),
            )
        # a cap's declared rows collide too
        led.cap("pub", 1.0, 1e-5, data_rows=(RowSet("u", "public", None),))
        with pytest.raises(
            RowRoleCollisionError,
            match="as private by dataset 'pub2': dataset 'pub' already reads them as public",
        ):
            _reserve(led, "pub2", _rows([1], source="u"), PureEpsilon(0.5))


def test_rows_never_recorded_compose_but_do_not_collide(tmp_path):
    """An entry without rows is assumed to read every row of a built-in source privately: composed
    (fail closed), but it cannot refuse a role it never declared."""
    with open_ledger(tmp_path / "l.sqlite") as led:
        led.record(_release("heart", PureEpsilon(0.5)))
        r = led.check(
            dataset="heart-mix",
            partition="train",
            event=PureEpsilon(0.5),
            adjacency=ADJ,
            data_rows=_rows([1], public=[2], source="uci-heart-cleveland"),
        )
        assert r["allowed"]


EVENT = SubsampledGaussian(1.1, 0.01, 300)


def test_an_edited_prv_cache_never_decides_a_cap(tmp_path, monkeypatch):
    """The prv cache file's check hash is unkeyed: a forged entry (value and check rewritten) must not
    let a release past a cap that the computed bounds refuse."""
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    with open_ledger(tmp_path / "l.sqlite") as led:
        led.record(_release("d", EVENT))
        led.cap("d", 0.2, 1e-5)
        planned = dict(dataset="d", partition="train", event=EVENT, adjacency=ADJ)
        with result_cache.enabled():
            assert not led.check(**planned)["allowed"]
            led.summary()  # fills the cache file with the totals' prv answers
        path = tmp_path / "cache" / "prv_results.json"
        data = json.loads(path.read_text())
        assert data["entries"]
        for key, entry in data[
            "entries"
        ].items():  # the forger rewrites the value and its unkeyed check
            entry["value"] = {"epsilon": 0.01, "epsilon_lower": 0.0, "epsilon_estimate": 0.01}
            entry["check"] = result_cache._check(key, entry["value"])
        path.write_text(json.dumps(data))
        monkeypatch.setattr(lc, "_CACHE", lc.OrderedDict())
        with result_cache.enabled():
            led.summary()  # the forged answers are read (shown only) and remembered in this process
            assert not led.check(**planned)["allowed"]
            with pytest.raises(BudgetExceededError):
                led.reserve(**planned)
