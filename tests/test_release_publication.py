"""What a release publishes, and the output-directory check.

``release.json`` must publish no function of the private data other than the mechanism's output
and what the guarantee assumes public: no hash of the data, of the source files or of the user
ids, and timings only rounded (exact ones go to ``local.json``). A bad output directory is
refused before any work.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.data import load_dataset
from dpaudit.errors import UsageError
from dpaudit.records import (
    LOCAL_FILE,
    RELEASE_FILE,
    Release,
    check_out_dir,
    read_release,
    round_seconds,
    round_timings,
)
from dpaudit.releasing import release
from dpaudit.requests import DPELMRequest, MixMinRequest
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest
from dpaudit.mechanisms.dpsgd.mechanism import DPSGDMechanism


# ------------------------------------------------------------------------------ timings rounding


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False))
def test_round_seconds_is_coarse_idempotent_and_close(s):
    r = round_seconds(s)
    assert round_seconds(r) == r  # publishing twice never moves a value
    assert r == round(r, 1)  # never finer than 0.1 s
    assert (
        abs(r - s) <= max(0.05, 0.05 * s) + 1e-9
    )  # 2 significant figures: at most 5 % (or 0.05 s) off
    assert (
        len(f"{r:.6e}".split("e")[0].replace(".", "").rstrip("0")) <= 2
    )  # at most 2 significant digits


def test_round_seconds_exact_values():
    # independent reference: 2 significant figures by hand, then to 0.1 s
    cases = {
        0.0: 0.0,
        0.047: 0.0,
        0.46: 0.5,
        0.96: 1.0,
        5.67: 5.7,
        9.96: 10.0,
        123.4: 120.0,
        12345.0: 12000.0,
    }
    for s, want in cases.items():
        assert round_seconds(s) == want, s
    assert math.isinf(round_seconds(float("inf")))


def test_round_timings_keeps_counts_and_rounds_every_duration():
    t = {
        "train_seconds": 12.345,
        "torch_threads": 3,
        "executor": {"cpu_seconds": 0.123, "name": "built-in"},
        "per_step": [0.26, 1.04],
    }
    assert round_timings(t) == {
        "train_seconds": 12.0,
        "torch_threads": 3,
        "executor": {"cpu_seconds": 0.1, "name": "built-in"},
        "per_step": [0.3, 1.0],
    }


# ------------------------------------------------------------------------------ Release form


def _release(**kw) -> Release:
    base = dict(
        mechanism="dp-rvfl",
        dataset={"name": "digits", "split_sizes": {"train": 10, "val": 2, "test": 3}},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee={
            "type": "subsampled-gaussian",
            "noise_multiplier": 1.0,
            "sample_rate": 0.1,
            "steps": 10,
        },
        seed=0,
        noise_source={"source": "os-entropy"},
    )
    return Release(**{**base, **kw})


def test_local_fields_never_reach_the_published_form(tmp_path):
    digest = "3f" * 32
    exact = {"train_seconds": 1.23456, "torch_threads": 2}
    rel = _release(data_digest=digest, timings=round_timings(exact), exact_timings=exact)
    pub = rel.to_dict()
    assert (
        "data_digest" not in pub
        and "exact_timings" not in pub
        and pub["timings"] == {"train_seconds": 1.2, "torch_threads": 2}
    )
    assert rel.to_dict(local=True)["data_digest"] == digest  # between one operator's processes only
    from dpaudit.records import write_release

    write_release(rel, tmp_path)
    text = (tmp_path / RELEASE_FILE).read_text()
    assert digest not in text and "1.23456" not in text
    local = json.loads((tmp_path / LOCAL_FILE).read_text())
    assert (
        local["release_id"] == rel.id
        and local["timings"] == exact
        and "not_for_publication" in local
    )
    back = read_release(tmp_path)
    assert back.data_digest is None and back.timings == {"train_seconds": 1.2, "torch_threads": 2}
    # a release built with exact timings by hand is still published rounded
    assert _release(timings={"train_seconds": 1.23456}).to_dict()["timings"] == {
        "train_seconds": 1.2
    }


def test_old_release_json_with_published_hashes_still_loads(tmp_path):
    old = _release().to_dict()
    old.pop("data_digest", None)
    old.pop("exact_timings", None)
    old["dataset"] = {
        **old["dataset"],
        "sha256": "ab" * 32,
        "user_ids_sha256": "cd" * 32,
        "source_files": {"f.csv": "ef" * 32},
    }
    old["timings"] = {"train_seconds": 1.23456}
    (tmp_path / RELEASE_FILE).write_text(json.dumps(old))
    rel = read_release(tmp_path)
    assert rel.dataset["sha256"] == "ab" * 32 and rel.data_digest is None and rel.id == old["id"]


# ------------------------------------------------------------------------------ output directory


def test_check_out_dir_refuses_in_one_line_and_creates_good_ones(tmp_path):
    with pytest.raises(UsageError) as e:
        check_out_dir("/proc/x")
    msg = str(e.value)
    assert (
        "'/proc/x'" in msg
        and "cannot create it" in msg
        and "\n" not in msg
        and msg.startswith("out_dir must be")
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="it exists and is not a directory"):
        check_out_dir(tmp_path / "file")
    with pytest.raises(UsageError, match="cannot create it"):
        check_out_dir(tmp_path / "file" / "sub")
    assert check_out_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (
        tmp_path / "a"
    ).exists()  # checked by creating it, then left as found (a refused run leaves no trace)
    (tmp_path / "kept").mkdir()
    assert check_out_dir(tmp_path / "kept") == tmp_path / "kept"
    assert (tmp_path / "kept").is_dir() and list(
        (tmp_path / "kept").iterdir()
    ) == []  # the write probe is removed


def _no_work(*a, **k):
    raise AssertionError("work started before the output directory was checked")


def test_python_api_release_functions_check_out_dir_before_any_work(patch_everywhere, monkeypatch):
    import dpaudit.data
    from dpaudit.mechanisms.elm import mechanism as dp_elm
    from dpaudit.mechanisms.dpsgd import mechanism as dpsgd_release, schedule as rvfl
    from dpaudit.mechanisms.mixmin import mechanism as mixmin_pipeline, tasks as mixmin_tasks

    patch_everywhere(dpaudit.data, "load_dataset", _no_work)
    import dpaudit.accounting

    patch_everywhere(
        dpaudit.accounting, "calibrate_noise_multiplier", _no_work
    )  # DP-SGD plans calibrate through it
    monkeypatch.setattr(mixmin_pipeline, "load_task", _no_work)
    monkeypatch.setattr(mixmin_pipeline, "load_proxy_predictions", _no_work)
    monkeypatch.setattr(mixmin_pipeline, "calibrate_noise_multiplier", _no_work)
    calls = [
        lambda: release(
            "dp-rvfl", DPSGDRequest(model="dp-rvfl"), out_dir="/proc/x", progress=False
        ),
        lambda: release(
            DPSGDMechanism(user_ids=np.arange(1797)),
            DPSGDRequest(
                model="dp-rvfl", privacy_unit="user", records_per_user=2, reference_size=1257
            ),
            out_dir="/proc/x",
            progress=False,
        ),
        lambda: release("dp-elm", DPELMRequest(), out_dir="/proc/x"),
        lambda: release("mixmin", MixMinRequest(), out_dir="/proc/x"),
    ]
    for call in calls:
        with pytest.raises(
            UsageError,
            match="out_dir must be a directory dpaudit can create and write, got '/proc/x'",
        ):
            call()


# ------------------------------------------------------------------------------ neighbouring datasets


def _flat(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], obj


def _differing_paths(a: dict, b: dict) -> set[str]:
    fa, fb = dict(_flat(a)), dict(_flat(b))
    return {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)}


#: Fields that may differ between releases on neighbouring datasets: the mechanism's output and
#: evaluation on test data (metrics), rounded timings and per-run facts (id, time, paths). Not
#: the training count, nor anything built from it: the schedule (q, T, m0), the calibrated noise
#: and the claim come from the declared reference size, identical for neighbours.
PER_RUN = ("id", "created_at", "command", "artefacts.", "timings.", "metrics.")


def _allowed(path: str) -> bool:
    return any(path == p or (p.endswith(".") and path.startswith(p)) for p in PER_RUN)


def _minus_first_training_record(data):
    return dataclasses.replace(data, x_train=data.x_train[1:], y_train=data.y_train[1:])


def _plus_one_training_record(data):
    return dataclasses.replace(
        data,
        x_train=np.concatenate([data.x_train, data.x_test[:1]]),
        y_train=np.concatenate([data.y_train, data.y_test[:1]]),
    )


@pytest.mark.parametrize(
    "mechanism,neighbour_of",
    [
        ("dp-elm", _minus_first_training_record),
        ("dp-rvfl", _minus_first_training_record),
        ("dp-rvfl", _plus_one_training_record),
    ],
)
def test_neighbouring_datasets_publish_only_output_and_public_fields(
    mechanism, neighbour_of, tmp_path
):
    """digits and digits with one training record removed (added), same seeds and reproducible
    noise: the two release.json files differ only in the output and per-run fields (not in the
    schedule, nor the training count), and neither holds a digest of its data."""
    from dpaudit.releasing import release
    from dpaudit.requests import DPSGDRequest
    from dpaudit.mechanisms.dpsgd.mechanism import DPSGDMechanism

    full = load_dataset("digits")
    neighbour = neighbour_of(full)
    rels = {}
    for tag, data in (("full", full), ("neighbour", neighbour)):
        out = tmp_path / tag
        if mechanism == "dp-elm":  # private: pure epsilon, no calibration, so cheap
            rel = release(
                "dp-elm",
                DPELMRequest(
                    dataset=data.name, epsilon=1.0, width=5, seed=3, reproducible_noise=True
                ),
                prepared=data,
                out_dir=out,
                record=False,
            )
        else:  # the DP-SGD release block (batch 419: 1,258 records would give another q, T, m0); non-private: no calibration
            rel = release(
                "dp-rvfl",
                DPSGDRequest(
                    model="dp-rvfl",
                    dataset=data.name,
                    non_private=True,
                    epochs=1,
                    batch_size=419,
                    seed=3,
                ),
                prepared=data,
                out_dir=out,
                progress=False,
                record=False,
            )
        text = (out / RELEASE_FILE).read_text()
        for digest in (full.sha256, neighbour.sha256):
            assert digest not in text
        assert rel.data_digest == data.sha256  # kept in memory for the ledger's keyed fingerprint
        on_disk = json.loads(text)
        assert "sha256" not in on_disk["dataset"] and on_disk["dataset"]["source_files"] == []
        local = json.loads((out / LOCAL_FILE).read_text())
        assert (
            on_disk["timings"] == round_timings(local["timings"])
            and local["release_id"] == on_disk["id"]
        )
        rels[tag] = on_disk
    assert len(neighbour.y_train) != len(
        full.y_train
    )  # the neighbour really has another training count
    diff = _differing_paths(rels["full"], rels["neighbour"])
    assert {p for p in diff if not _allowed(p)} == set()
    if mechanism == "dp-rvfl":
        assert (
            rels["neighbour"]["config"]["reference_size"] == 1257
            and rels["neighbour"]["normalizer"] == 419
        )


def test_user_split_identity_publishes_user_counts_not_user_id_hashes():
    from dpaudit.data.users import attach_user_ids

    data = attach_user_ids(load_dataset("digits"), np.arange(1797) // 3)
    ident = data.identity()
    assert not any("sha" in k for k in ident) and data.user_ids_sha256 not in json.dumps(ident)
    assert ident["n_users"] == {
        p: np.unique(data.user_ids[p]).size for p in ("val", "test")
    }  # the training count is private


def test_mixmin_releases_publish_no_digest_of_the_private_records(tmp_path):
    from dpaudit.mechanisms.mixmin.tasks import load_digits_task, load_proxy_predictions

    task = load_digits_task(seed=1)
    ident = task.dataset_identity()
    assert "sha256" not in ident and task.data_digest() not in json.dumps(ident)
    rng = np.random.default_rng(0)
    probs = rng.uniform(0.05, 0.95, size=(200, 3))
    labels = (rng.random(200) < probs[:, 2]).astype(float)
    f = tmp_path / "pp.npz"
    np.savez(f, probs=probs, labels=labels)
    digest = load_proxy_predictions(f).sha256
    # q = 1 (n <= B): the calibration is the plain Gaussian's, fast
    rel = release(
        "mixmin",
        MixMinRequest(
            proxy_predictions=str(f),
            epsilon=4.0,
            steps=20,
            batch_size=1000,
            clipping_norm=5.0,
            reference_size=200,
        ),
        out_dir=tmp_path / "pp",
        record=False,
    )
    text = (tmp_path / "pp" / RELEASE_FILE).read_text()
    assert digest not in text and "sha256" not in json.loads(text)["dataset"]
    assert rel.data_digest == digest
    local = json.loads((tmp_path / "pp" / LOCAL_FILE).read_text())
    assert json.loads(text)["timings"] == round_timings(local["timings"])


def test_sweep_releases_reach_the_ledger_with_a_keyed_fingerprint_and_publish_no_digest(tmp_path):
    """A sweep worker hands its release to the coordinator (the ledger writer) with the local
    digest; the ledger keys it, and neither release.json nor the sweep store holds it."""
    from dpaudit.ledger.book import open_ledger
    from dpaudit.sweeps import open_store, parse_spec, run_sweep

    spec = parse_spec(
        'name = "elm-tiny"\nmodels = ["dp-elm-L3"]\ndatasets = ["digits"]\nepsilons = [2.0]\nseeds = [1]\n'
        "[settings]\nreproducible_noise = true\n"
    )
    ledger_path = tmp_path / "ledger.sqlite"
    s = run_sweep(spec, out=tmp_path, ledger_path=ledger_path)
    assert (s.done, s.failed) == (1, 0), s.failures
    digest = load_dataset("digits").sha256
    with open_ledger(ledger_path) as led:
        (entry,) = led.entries(dataset="digits", kind="release")
        assert entry.payload["dataset_fingerprint"] == led.fingerprint(digest)
    for f in (tmp_path / "elm-tiny").rglob("*"):
        if f.is_file() and f.name != LOCAL_FILE:
            assert digest.encode() not in f.read_bytes(), f
    with open_store(tmp_path / "elm-tiny", create=False) as st:
        assert digest not in json.dumps([r.result for r in st.rows(status="done")])
