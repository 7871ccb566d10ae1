"""Reports of sweeps: a real (tiny) sweep on the embedded digits data, summarised, not carded.

One module-scoped sweep (2 models x 1 budget x 2 seeds, one epoch, reproducible noise) is built
with :func:`dpaudit.sweeps.run_sweep` and recorded in its own ledger; every test reads it (or a
copy it tampers with). Composed epsilons are checked against dpaudit.accounting directly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.accounting import Composed, compute_epsilon, event_from_dict
from dpaudit.cli import app
from dpaudit.reports import build_report, write_report
from dpaudit.sweeps import load_records, parse_spec, sweep_tables

from report_fixtures import make_release

SPEC = """
name = "tiny-report"
models = ["dp-rvfl", "logistic-raw"]
datasets = ["digits"]
epsilons = [2.0]
seeds = [42, 43]
[settings]
delta = 1e-5
reproducible_noise = true
epochs = 1
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from dpaudit.sweeps import run_sweep

    root = tmp_path_factory.mktemp("sweep-report")
    ledger = root / "ledger.sqlite"
    s = run_sweep(parse_spec(SPEC), out=root / "out", ledger_path=ledger)
    assert (s.done, s.failed) == (4, 0), s.failures
    from dpaudit.sweeps.runner import write_tables  # what `dpaudit sweep` writes after a run

    write_tables(root / "out" / "tiny-report", *load_records(root / "out" / "tiny-report"))
    return {"dir": root / "out" / "tiny-report", "ledger": ledger, "root": root}


def _releases(folder: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(folder.rglob("release.json"))]


@pytest.fixture(scope="module")
def report(sweep):
    return build_report([sweep["dir"]], ledger_path=sweep["ledger"])


def test_sweep_section_counts_tables_and_accounting(sweep, report):
    secs = report["sections"]
    assert secs["claim"] == [] and report["inputs"]["releases"] == []  # summarised, not carded
    (sw,) = secs["sweep"]
    assert sw["name"] == "tiny-report" and Path(sw["store"]) == sweep["dir"] / "sweep.sqlite"
    assert sw["counts"] == {"done": 4, "failed": 0, "pending": 0, "total": 4}
    assert sw["releases"] == 4 and sw["missing_releases"] == [] and sw["orphan_releases"] == []
    acc = sw["accounting"]
    assert (acc["status"], acc["checked"], acc["ok"], acc["mismatch"]) == ("ok", 4, 4, 0)
    assert acc["line"].startswith("4 of 4 releases check out") and acc["reproducible_noise"] == 4
    # tables: recomputed from the store, equal to sweep_tables on the same records
    name, records = load_records(sweep["dir"])
    expected = json.loads(json.dumps(sweep_tables(records, name=name)))
    assert (
        sw["tables"]["cells"] == expected["cells"]
        and sw["tables"]["contrasts"] == expected["contrasts"]
    )
    assert sw["tables_json"] == "matches"
    cells = [c for c in sw["tables"]["cells"] if c["metric"] == "accuracy"]
    assert {c["model"] for c in cells} == {"dp-rvfl", "logistic-raw"} and all(
        c["summary"]["n"] == 2 for c in cells
    )
    cons = sw["tables"]["contrasts"]
    assert cons and all(
        c["n"] == 2 and c["p_value"] == 0.5 and c["p_holm"] >= c["p_value"] for c in cons
    )
    assert {r["model"] for r in sw["tables"]["table3"]["rows"]} == {"dp-rvfl", "logistic-raw"}
    # one verdict line for the sweep; nothing failed the accounting check
    (v,) = secs["verdict"]
    assert (
        v["key"] == "sweep:tiny-report"
        and v["status"] == "not-audited"
        and "4 of 4 releases check out" in v["line"]
    )


def test_sweep_budget_composes_every_release(sweep, report):
    (sw,) = report["sections"]["sweep"]
    (b,) = sw["budget"]
    rels = _releases(sweep["dir"])
    claims = [r["epsilon"] for r in rels]
    assert (b["dataset"], b["partition"], b["releases"]) == ("digits", "train", 4)
    assert b["max_single_epsilon"] == max(claims) and b["naive_sum"] == pytest.approx(
        sum(claims), rel=1e-12
    )
    direct = compute_epsilon(
        Composed(tuple(event_from_dict(r["guarantee"]) for r in rels)), delta=1e-5, accountant="rdp"
    )
    assert b["rdp"] == pytest.approx(direct.epsilon, rel=1e-12)
    assert (
        b["rdp"] > b["max_single_epsilon"] * 1.2
    )  # four runs on the same records cost more than one
    assert b["prv"] is not None and b["prv"] > b["max_single_epsilon"]
    assert b["sentence"].startswith(
        f"4 releases of this sweep on digits/train compose to eps = {b['rdp']:.3f} (rdp) at delta = 1e-05"
    )
    assert f"the largest single release claims eps = {max(claims):.3f}" in b["sentence"]
    # the report-wide composition covers the sweep's releases too
    (row,) = report["sections"]["budget"]["composition"]
    assert row["releases"] == 4 and row["rdp"] == b["rdp"]
    # the ledger recorded all four, tagged with the sweep; their stored events compose the same
    led = sw["ledger"]
    assert (led["recorded"], led["tagged"], led["missing"], led["voided"]) == (4, 4, 0, 0)
    assert led["composition"][0]["rdp"] == pytest.approx(b["rdp"], rel=1e-12)


def test_sweep_releases_are_never_also_ordinary_releases(sweep, tmp_path):
    one = next(sweep["dir"].rglob("release.json"))
    other = make_release(tmp_path / "single", seed=7)
    rep = build_report(
        [sweep["root"] / "out", one, sweep["dir"] / "sweep.sqlite", tmp_path / "single"],
        ledger_path=sweep["ledger"],
    )
    assert [r["id"] for r in rep["inputs"]["releases"]] == [
        other.id
    ]  # only the ordinary one gets a card
    assert [c["release_id"] for c in rep["sections"]["claim"]] == [other.id]
    (sw,) = rep["sections"]["sweep"]
    assert sw["releases"] == 4 and len(set(sw["release_ids"])) == 4
    assert {v["key"] for v in rep["sections"]["verdict"]} == {"rvfl", "sweep:tiny-report"}
    # a sweep given as its store file reads the same releases (also after one of them by name)
    alone = build_report([one, sweep["dir"] / "sweep.sqlite"], ledger_path=sweep["ledger"])
    assert alone["inputs"]["releases"] == [] and sorted(
        alone["sections"]["sweep"][0]["release_ids"]
    ) == sorted(sw["release_ids"])


def test_a_tampered_release_in_the_sweep_is_an_accounting_mismatch(sweep, tmp_path):
    copy = tmp_path / "tiny-report"
    shutil.copytree(sweep["dir"], copy)
    f = sorted(copy.rglob("release.json"))[0]
    rel = json.loads(f.read_text())
    rel["epsilon"] = rel["epsilon"] / 2  # claims half of what its guarantee costs
    f.write_text(json.dumps(rel))
    rep = build_report([copy], ledger_path=sweep["ledger"])
    (sw,) = rep["sections"]["sweep"]
    acc = sw["accounting"]
    assert (acc["status"], acc["mismatch"], acc["ok"]) == ("mismatch", 1, 3)
    assert acc["mismatches"][0]["release_id"] == rel["id"]
    (v,) = rep["sections"]["verdict"]
    assert (
        v["status"] == "accounting-mismatch" and "ACCOUNTING MISMATCH: 1 of 4 releases" in v["line"]
    )
    assert any(n["level"] == "error" and rel["id"][:12] in n["message"] for n in rep["notes"])
    res = _runner().invoke(
        app,
        [
            "report",
            str(copy),
            "--format",
            "json",
            "--out",
            str(tmp_path / "r.json"),
            "--ledger",
            str(sweep["ledger"]),
            "--fail-on-violation",
        ],
    )
    assert res.exit_code == 1, res.output


def test_html_and_markdown_render_the_sweep_section(report, tmp_path):
    (sw,) = report["sections"]["sweep"]
    sentence = sw["budget"][0]["sentence"]
    md = write_report(report, tmp_path / "r.md", fmt="md").read_text()
    html = write_report(report, tmp_path / "r.html", fmt="html").read_text()
    assert "## 5. Sweep" in md and "## 8. Reproduce" in md and "## 4. Budget" in md
    for text in (
        "Table 3 comparison",
        "accuracy (%) per cell",
        "p (Holm)",
        "W/T/L seeds",
        "Budget of this sweep",
    ):
        assert text in md and text in html
    assert sentence in md and sentence in html
    assert (
        '<section id="sweep" data-section="sweep"><details class="section"><summary><h2>5. Sweep</h2>'
        in html
    )
    assert "4 ledger entries of sweep tiny-report are summarised in the Sweep section" in md


def _runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 always separates stderr
        return CliRunner()


def test_cli_report_of_a_sweep_folder(sweep, tmp_path):
    out = tmp_path / "sweep.md"
    res = _runner().invoke(
        app,
        [
            "report",
            str(sweep["dir"]),
            "--format",
            "md",
            "--out",
            str(out),
            "--ledger",
            str(sweep["ledger"]),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "## 5. Sweep" in out.read_text() and "sweep tiny-report (4 releases)" in res.stdout
    js = _runner().invoke(
        app, ["report", str(sweep["dir"]), "--format", "json", "--ledger", str(sweep["ledger"])]
    )
    assert js.exit_code == 0
    assert json.loads(js.stdout)["sections"]["sweep"][0]["counts"]["done"] == 4


def test_an_unreadable_store_still_checks_and_composes_the_releases(sweep, tmp_path):
    copy = tmp_path / "tiny-report"
    shutil.copytree(sweep["dir"], copy)
    for f in copy.glob("sweep.sqlite*"):
        f.unlink()
    (copy / "sweep.sqlite").write_bytes(b"not a database" * 100)
    rep = build_report([copy], ledger_path=sweep["ledger"])
    (sw,) = rep["sections"]["sweep"]
    assert sw["error"] and sw["tables"] is None
    assert (
        sw["accounting"]["ok"] == 4 and sw["budget"][0]["releases"] == 4
    )  # fail closed: still composed
    (v,) = rep["sections"]["verdict"]
    assert v["status"] == "inconclusive" and "could not be read" in v["line"]
    assert any(n["level"] == "error" and n["section"] == "sweep" for n in rep["notes"])


def test_a_release_missing_from_the_folder_is_composed_from_the_store(sweep, report, tmp_path):
    copy = tmp_path / "tiny-report"
    shutil.copytree(sweep["dir"], copy)
    gone = sorted(copy.rglob("release.json"))[0]
    gone_id = json.loads(gone.read_text())["id"]
    gone.unlink()
    rep = build_report([copy], ledger_path=sweep["ledger"])
    (sw,) = rep["sections"]["sweep"]
    assert (
        sw["releases"] == 3
        and sw["missing_releases"] == [gone_id]
        and "missing-releases" in rep["sections"]["verdict"][0]["flags"]
    )
    (b,) = sw["budget"]
    full = report["sections"]["sweep"][0]["budget"][0]
    assert (b["releases"], b["from_store"], b["lower_bound_only"]) == (4, 1, False)
    assert b["rdp"] == pytest.approx(full["rdp"], rel=1e-12)  # the store kept what its event needs
    assert any(n["level"] == "error" and gone_id[:12] in n["message"] for n in rep["notes"])


def test_several_sweeps_each_get_a_section_and_a_verdict(sweep, tmp_path):
    from dpaudit.sweeps import run_sweep

    selftest = parse_spec(
        'name = "st"\nrunner = "selftest"\nmodels = ["mean", "median"]\ndatasets = ["synthetic"]\n'
        "epsilons = [1.0]\nseeds = [1, 2]\n[settings]\nreproducible_noise = true\nn = 50\n"
    )
    s = run_sweep(selftest, out=tmp_path, ledger_path=tmp_path / "unused.sqlite")
    assert s.done == 4
    rep = build_report([sweep["dir"], tmp_path / "st"], ledger_path=sweep["ledger"])
    by = {e["name"]: e for e in rep["sections"]["sweep"]}
    assert (
        set(by) == {"tiny-report", "st"} and by["st"]["releases"] == 0 and by["st"]["budget"] == []
    )
    assert (
        by["st"]["counts"]["done"] == 4 and by["st"]["tables"]["contrast_family_size"] == 1
    )  # mean − median, accuracy
    verdicts = {v["key"]: v["status"] for v in rep["sections"]["verdict"]}
    assert verdicts == {"sweep:tiny-report": "not-audited", "sweep:st": "no-claim"}


def test_failed_tasks_say_whether_the_current_spec_still_has_them(sweep, tmp_path):
    """A failure left from an earlier version of the spec is labelled, not shown as a hole in the grid."""
    from dpaudit.sweeps.spec import Task
    from dpaudit.sweeps.store import open_store

    copy = tmp_path / "tiny-report"
    shutil.copytree(sweep["dir"], copy)
    current = parse_spec(SPEC).tasks()[0]
    gone = Task(
        current.runner, "dp-rvfl", "digits", 8.0, 42, current.settings
    )  # eps 8 is not in the spec
    with open_store(copy, create=False) as st:
        st.add_tasks([gone])
        st.mark_failed(gone.key, "UsageError: something went wrong.")
    rep = build_report([copy])
    (sw,) = rep["sections"]["sweep"]
    (fl,) = sw["failures"]
    assert fl["key"] == gone.key and fl["in_current_spec"] is False
    assert any("not in the sweep's current spec" in n["message"] for n in rep["notes"])
    # the spec is widened to eps 8 (as a later `dpaudit sweep` of the new spec would record it)
    with open_store(copy, create=False) as st:
        st.set_spec(parse_spec(SPEC.replace("epsilons = [2.0]", "epsilons = [2.0, 8.0]")).to_dict())
    rep = build_report([copy])
    (fl,) = rep["sections"]["sweep"][0]["failures"]
    assert fl["in_current_spec"] is True
    assert not any("not in the sweep's current spec" in n["message"] for n in rep["notes"])
