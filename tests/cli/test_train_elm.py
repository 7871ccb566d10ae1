"""`dpaudit train dp-elm` through CliRunner: outputs, release.json, noise flags, errors."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()


def _run(tmp_path, name, *extra):
    args = [
        "train",
        "dp-elm",
        "--dataset",
        "digits",
        "--out",
        str(tmp_path / name),
        "--ledger",
        str(tmp_path / "ledger.sqlite"),
        *extra,
    ]
    return runner.invoke(app, args)


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_output_and_release_file(tmp_path):
    d = _json(_run(tmp_path, "a", "--width", "10", "--eps", "2", "--json"))
    assert (
        d["noise_scale"] == 60.0
        and d["width"] == 10
        and d["sampler"] == "discrete-laplace"
        and d["sampler_certified"] is True
    )
    assert (
        d["accountant"] == "pure"
        and d["delta"] == 0.0
        and d["epsilon"] == 2.0
        and d["target_epsilon"] == 2.0
    )
    assert d["noise_source"]["source"] == "os-entropy" and d["seed"] == 42
    rel = json.loads((tmp_path / "a" / "release.json").read_text())
    for key in (
        "mechanism",
        "dataset",
        "adjacency",
        "accountant",
        "target_epsilon",
        "epsilon",
        "delta",
        "noise_source",
        "metrics",
        "timings",
        "seed",
    ):
        assert key in rel
    assert (
        rel["config"]["sampler"] == "discrete-laplace"
        and rel["config"]["width"] == 10
        and rel["config"]["noise_scale"] == 60.0
    )
    assert d["release"] == str(tmp_path / "a" / "release.json")
    assert d["release_id"] == rel["id"]


def test_human_output_prints_the_noise_scale(tmp_path):
    r = _run(tmp_path, "b", "--width", "10", "--eps", "0.1")
    assert r.exit_code == 0, r.output
    assert "noise scale 1200" in r.stdout
    assert "L(L+2)/eps = 1200" in r.stderr


def test_same_seed_fresh_noise_unless_reproducible(tmp_path):
    def gram(name, *extra):
        _json(_run(tmp_path, name, "--width", "3", "--seed", "7", "--json", *extra))
        with np.load(tmp_path / name / "weights.npz") as w:
            return w["noisy_gram"]

    assert not np.array_equal(gram("a"), gram("b"))
    assert np.array_equal(gram("c", "--reproducible-noise"), gram("d", "--reproducible-noise"))
    rc = json.loads((tmp_path / "c" / "release.json").read_text())
    rd = json.loads((tmp_path / "d" / "release.json").read_text())
    assert rc["metrics"] == rd["metrics"] and rc["noise_source"] == {
        **rd["noise_source"],
        "source": "reproducible",
        "seed": 7,
        "secret": False,
    }


def test_cryptographic_source_and_textbook_sampler_flags(tmp_path):
    d = _json(
        _run(
            tmp_path,
            "e",
            "--width",
            "1",
            "--noise-source",
            "cryptographic",
            "--sampler",
            "textbook",
            "--adjacency",
            "replace-record",
            "--json",
        )
    )
    assert (
        d["noise_source"]["source"] == "cryptographic"
        and d["sampler"] == "textbook"
        and d["sampler_certified"] is False
    )
    assert d["adjacency"] == "replace-record" and d["noise_scale"] == 1.5
    r = _run(
        tmp_path, "f", "--width", "1", "--sampler", "textbook", "--adjacency", "replace-record"
    )
    assert r.exit_code == 0 and "leaks" in r.stderr
    # The ledger holds replace-one releases of digits now: an add/remove claim cannot compose.
    r = _run(tmp_path, "g", "--width", "1")
    assert r.exit_code == 2 and "adjacency" in r.stderr and not (tmp_path / "g").exists()


def test_bad_values_exit_2_with_one_line(tmp_path):
    for extra, msg in (
        (["--width", "0"], "width must be an integer >= 1"),
        (["--eps", "-1"], "--eps must be a finite number > 0"),
        (["--dataset", "nope"], "dataset"),
    ):
        r = _run(tmp_path, "g", *extra)
        assert r.exit_code == 2, r.output
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and msg in errors[0]
        assert r.stdout == ""
    r = _run(tmp_path, "h", "--sampler", "snapping")
    assert r.exit_code == 2


def test_over_cap_is_refused_before_writing(tmp_path):
    from dpaudit.ledger.book import open_ledger

    with open_ledger(tmp_path / "ledger.sqlite") as lg:
        lg.cap("digits", 1.0, 1e-5)
    r = _run(tmp_path, "i", "--eps", "2")
    assert r.exit_code == 2 and not (tmp_path / "i").exists()


def test_non_private_flag(tmp_path):
    d = _json(_run(tmp_path, "np", "--width", "3", "--non-private", "--json"))
    assert d["epsilon"] == "inf" and d["noise_scale"] is None and d["sampler_certified"] is None
