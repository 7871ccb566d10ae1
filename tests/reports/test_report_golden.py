"""The whole report, byte for byte: a fixed corpus of inputs (releases, a ledger, trial-based audits of
every stored layout, one-run and white-box records) builds the same JSON model and renders the same
Markdown, HTML and PNG figures as the reader that wrote data/golden_report.json; a stored sweep
report (data/golden_sweep_report.json) renders the same Markdown and HTML, and a new run of its
sweep builds the same model (up to ids, times and process ids).

Regenerate (only when a change of output is intended) with
``python tests/reports/test_report_golden.py --write`` on the source tree whose output is the reference;
``--corpus`` first writes the corpus itself (its ids and times are then fixed in data/).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "golden_corpus"
GOLDEN = DATA / "golden_report.json"
SWEEP_REPORT = DATA / "golden_sweep_report.json"
#: Times, and hashes and ids (hex with a letter, not inside a number), that a fresh ledger (or a new
#: run) makes differently every time.
VOLATILE = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[.\d]*(\+00:00|Z)?|(?<![\d.])(?=[0-9a-f]*[a-f])[0-9a-f]{12,}(?![\d-])"
)


def _digest(text: str | bytes, root: Path | None = None) -> str:
    if isinstance(text, str):
        text = VOLATILE.sub("<v>", text.replace(str(root), "<root>") if root else text).encode()
    return hashlib.sha256(text).hexdigest()


def _build(root: Path) -> dict:
    """The corpus copied under ``root`` with a fresh ledger of its private releases and
    the stored audit records of data/old_records.json, reported."""
    from dpaudit.ledger.book import open_ledger
    from dpaudit.records import Release, read_json, write_json_atomic
    from dpaudit.reports import build_report

    shutil.copytree(CORPUS, root / "runs")
    for name, record in json.loads((DATA / "old_records.json").read_text()).items():
        write_json_atomic(root / "runs" / "stored" / name / "audit.json", record)
    with open_ledger(root / "ledger.sqlite") as ledger:
        for f in sorted((root / "runs").rglob("release.json")):
            rel = Release.from_dict(read_json(f, "release"))
            if not rel.non_private:
                ledger.record(rel)
    return build_report([root / "runs"], ledger_path=root / "ledger.sqlite", command="report")


def _rendered(report: dict, out: Path, root: Path | None) -> dict[str, str]:
    """Digests of the model, its Markdown, its HTML and each figure."""
    from dpaudit.reports import write_report
    from dpaudit.reports.plots import all_figures

    model = {k: v for k, v in report.items() if k not in ("generated_at", "git_commit")}
    model["dpaudit_version"] = None
    figures = all_figures(report)
    md = write_report(report, out / "report.md", fmt="md", figures=figures).read_text()
    html = write_report(report, out / "report.html", fmt="html", figures=figures).read_text()
    meta = re.compile(r"by dpaudit [^ ]+( \(commit [0-9a-f]+\))?")
    out = {
        "model": _digest(json.dumps(model, indent=2), root),
        "markdown": _digest(meta.sub("", md), root),
        "html": _digest(meta.sub("", html), root),
    }
    return out | {f"figure {fig.name}": _digest(fig.png) for fig in figures}


def _sweep_rendered(out: Path) -> dict[str, str]:
    report = json.loads(SWEEP_REPORT.read_text())
    return {f"sweep {k}": v for k, v in _rendered(report, out, None).items() if k != "model"}


def _comparable_digests(golden: dict, got: dict) -> tuple[dict, dict]:
    """Both digest sets, without the PNG figures when another matplotlib draws them (its pixels
    are not ours to pin across versions; the warning says they were not compared)."""
    import warnings

    import matplotlib

    if golden.pop("matplotlib") == matplotlib.__version__:
        return golden, got
    warnings.warn(
        f"PNG digests not compared: written with another matplotlib than {matplotlib.__version__}"
    )
    return ({k: v for k, v in d.items() if "figure " not in k} for d in (golden, got))


def test_the_corpus_reports_and_renders_as_the_reference_reader_did(tmp_path, monkeypatch):
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "no-ledger.sqlite"))
    golden = json.loads(GOLDEN.read_text())
    (tmp_path / "out").mkdir()
    got = _rendered(_build(tmp_path), tmp_path / "out", tmp_path)
    want = {k: v for k, v in golden.items() if not k.startswith("sweep ")}
    want, got = _comparable_digests(want, got)
    assert want == got


def test_a_stored_sweep_report_renders_as_the_reference_renderer_did(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    want = {k: v for k, v in golden.items() if k.startswith("sweep ") or k == "matplotlib"}
    want, got = _comparable_digests(want, _sweep_rendered(tmp_path))
    assert want == got


def _write_corpus() -> None:
    """The inputs of the golden report (run once; their random ids and times are then fixed)."""
    import tempfile

    from report_fixtures import make_release, synthetic_audit, write_audit_record
    from test_report_power import _one_run

    from dpaudit.records import write_json_atomic

    shutil.rmtree(CORPUS, ignore_errors=True)
    rels = []
    for nm, eps in ((12.0, 1.0), (6.0, 2.0), (3.5, 4.0)):
        for s in range(2):
            metrics = {"accuracy": 0.7 + 0.05 * eps + 0.01 * s, "f1_macro": 0.6 + 0.05 * eps}
            rels.append(
                make_release(
                    CORPUS / f"e{eps}-s{s}",
                    noise_multiplier=nm,
                    sample_rate=1.0,
                    steps=5,
                    target_epsilon=eps,
                    seed=s,
                    metrics=metrics,
                )
            )
    make_release(CORPUS / "np", non_private=True, metrics={"accuracy": 0.95, "f1_macro": 0.93})
    make_release(CORPUS / "under", mechanism="dp-elm", noise_multiplier=2.0, epsilon=0.5)
    ok, s_in, s_out = synthetic_audit(claimed_epsilon=rels[0].epsilon, shift=0.3, per_world=200)
    write_audit_record(CORPUS / "e1.0-s0" / "audit", ok, release_id=rels[0].id)
    bad, *_ = synthetic_audit(
        claimed_epsilon=1.0, shift=5.0, mechanism="broken-gaussian", per_world=200
    )
    write_audit_record(CORPUS / "audit-broken", bad)
    write_json_atomic(CORPUS / "one-run" / "old" / "one_run.json", _one_run())
    fdp = {"epsilon_lower_bound": 2.5, "violated": True, "guesses": 100, "correct": 80}
    write_json_atomic(CORPUS / "one-run" / "fdp" / "one_run.json", _one_run(fdp=fdp))
    write_json_atomic(CORPUS / "white-box" / "white_box.json", WHITE_BOX)
    with tempfile.TemporaryDirectory() as tmp:
        SWEEP_REPORT.write_text(json.dumps(_sweep_report(Path(tmp)), indent=1) + "\n")


def _sweep_report(tmp: Path) -> dict:
    """The report of a real tiny sweep (test_report_sweep's spec) run in ``tmp`` (shown as /sweeps)."""
    from test_report_sweep import SPEC

    from dpaudit.reports import build_report
    from dpaudit.sweeps import load_records, parse_spec, run_sweep
    from dpaudit.sweeps.runner import write_tables

    out = tmp / "out"
    run_sweep(parse_spec(SPEC), out=out, ledger_path=tmp / "l.sqlite")
    write_tables(out / "tiny-report", *load_records(out / "tiny-report"))
    report = build_report([out / "tiny-report"], ledger_path=tmp / "l.sqlite")
    return json.loads(json.dumps(report).replace(str(tmp), "/sweeps"))


def _comparable(report: dict) -> str:
    """A report's JSON without what a new run changes: its time, version, ids and process id."""
    kept = {k: v for k, v in report.items() if k not in ("generated_at", "git_commit")}
    text = json.dumps(kept | {"dpaudit_version": None}, indent=1)
    return re.sub(r'"pid": \d+', '"pid": 0', VOLATILE.sub("<v>", text))


def test_a_sweep_reports_as_the_reference_reader_did(tmp_path):
    stored = json.loads(SWEEP_REPORT.read_text())
    assert _comparable(_sweep_report(tmp_path)) == _comparable(stored)


#: A white-box record in the shape dpaudit.mechanisms.dpsgd.white_box_target writes.
WHITE_BOX = {
    "threat_model": "white-box",
    "bounds": {
        "main": {
            "epsilon_lb": 9.5,
            "claimed_epsilon": 8.0,
            "delta": 1e-5,
            "confidence": 0.95,
            "accountant": "rdp",
            "violation": True,
            "noise_multiplier_upper": 0.8,
            "sensitivity_lower": 0.99,
            "sample_rate_lower": 0.01,
            "steps": 50,
            "observations": 300,
        }
    },
    "runs": {"main": {"model": "dp-dense", "dataset": "digits", "canaries": 300}},
    "controls_ok": {"no-noise": True, "null": True},
}


if __name__ == "__main__" and sys.argv[1] in ("--write", "--corpus"):
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if sys.argv[1] == "--corpus":
        _write_corpus()
    with tempfile.TemporaryDirectory() as tmp:
        import os

        os.environ["DPAUDIT_LEDGER"] = str(Path(tmp, "no-ledger.sqlite"))
        (Path(tmp) / "out").mkdir()
        (Path(tmp) / "sweep").mkdir()
        got = _rendered(_build(Path(tmp)), Path(tmp, "out"), Path(tmp))
        got |= _sweep_rendered(Path(tmp, "sweep"))
    import matplotlib

    got["matplotlib"] = matplotlib.__version__
    GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
