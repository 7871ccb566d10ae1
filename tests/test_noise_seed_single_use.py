"""A secret noise seed file never gives two releases the same noise.

The attack: two noisy-sum releases from one seed file at different sigma, r_i = S + sigma_i C z.
With one shared z, (sigma_2 r_1 - sigma_1 r_2) / (sigma_2 - sigma_1) is the exact clipped sum S.
Each release must instead draw its own use of the secret (claimed on disk before any noise is
drawn, under a lock, with a fresh nonce): the combination then misses S by the noise's size, on
every route to the secret (release(), read_noise_seed / make_noise_source, concurrent processes,
a run that died, a copied file), while a recorded release can still be replayed to check it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpaudit.errors import UsageError
from dpaudit.mechanisms.simple.noisy_sum import MECHANISM, NoisySumRequest, clipped_rows
from dpaudit.noise import NoiseSource
from dpaudit.releasing import make_noise_source, read_noise_seed, release, secret_noise_seed


@pytest.fixture(scope="module")
def digits():
    from dpaudit.data import load_dataset

    return load_dataset("digits")


def _released_sum(folder):
    return np.load(folder / "sum.npz")["sum"]


def _records(seed_file):
    return [json.loads(line) for line in seed_file.read_text().splitlines()[1:]]


def test_two_releases_from_one_seed_file_do_not_reveal_the_clipped_sum(tmp_path, digits):
    seed_file, led = tmp_path / "noise.seed", tmp_path / "l.sqlite"
    with secret_noise_seed(seed_file):
        a, b = (
            release(
                "noisy-sum",
                NoisySumRequest(epsilon=eps),
                out_dir=tmp_path / name,
                ledger_path=led,
                prepared=digits,
            )
            for eps, name in ((1.0, "a"), (2.0, "b"))
        )
    s1, s2 = a.noise_multiplier, b.noise_multiplier
    assert (
        s1 != s2 and a.noise_source["source"] == b.noise_source["source"] == "reproducible-secret"
    )
    truth = clipped_rows(digits.x_train, 1.0).sum(axis=0)
    combined = (s2 * _released_sum(tmp_path / "a") - s1 * _released_sum(tmp_path / "b")) / (s2 - s1)
    # independent noise: the combination misses by ~ sqrt(s1^2 s2^2 d) / |s2 - s1| (~60 here), never ~1e-14
    assert np.linalg.norm(combined - truth) > 1.0
    # the file says which use made which release (and each use was claimed before its noise)
    records = _records(seed_file)
    claims = [r["use"] for r in records if "nonce" in r]
    made = {r["use"]: r["released"] for r in records if "released" in r}
    assert claims == [1, 2] and made == {1: [a.id], 2: [b.id]}


def test_a_recorded_release_is_replayed_to_check_it_but_never_released_again(tmp_path, digits):
    from dpaudit.releasing import build_release, replay_noise_source

    seed_file = tmp_path / "noise.seed"
    request = NoisySumRequest(epsilon=1.0)
    with secret_noise_seed(seed_file):
        a = release(
            "noisy-sum",
            request,
            out_dir=tmp_path / "a",
            ledger_path=tmp_path / "l.sqlite",
            prepared=digits,
        )
    plan = MECHANISM.plan(request, MECHANISM.data_info(request, digits))
    replayed = MECHANISM.run(plan, digits, replay_noise_source(seed_file, a.id))
    assert np.array_equal(
        replayed.arrays["sum"], _released_sum(tmp_path / "a")
    )  # the release, reproduced
    with pytest.raises(UsageError, match="noise must be fresh for a release"):
        build_release(
            MECHANISM,
            plan,
            replayed,
            noise=replay_noise_source(seed_file, a.id),
            out_dir=tmp_path / "x",
            data=digits,
        )
    with pytest.raises(UsageError, match="release_id must be a release recorded"):
        replay_noise_source(seed_file, "not-a-release")


def test_library_routes_claim_a_new_use_each_time_and_draw_from_it_once(tmp_path):
    seed_file = tmp_path / "noise.seed"
    first, second = read_noise_seed(seed_file), read_noise_seed(seed_file)
    assert (first.use, second.use) == (1, 2)
    draws = [
        make_noise_source(seed=0, secret_seed=u).gaussian_numpy(8, 1.0) for u in (first, second)
    ]
    assert not np.array_equal(*draws)
    with pytest.raises(UsageError, match="noise seed use must be drawn from once"):
        make_noise_source(seed=0, secret_seed=first)
    secret = int(seed_file.read_text().splitlines()[0], 16)
    with pytest.raises(UsageError, match="secret_seed must be a claimed use"):
        make_noise_source(
            seed=0, secret_seed=secret
        )  # a bare secret would give the same stream every time
    assert str(secret) not in repr(first) and f"{secret:x}" not in repr(first)
    # a file written before uses were recorded (the secret alone) never repeats its old stream
    legacy = tmp_path / "legacy.seed"
    legacy.write_text(f"{secret:064x}\n")
    old_stream = NoiseSource("reproducible-secret", seed=secret).gaussian_numpy(8, 1.0)
    first_use = make_noise_source(seed=0, secret_seed=read_noise_seed(legacy))
    assert not np.array_equal(first_use.gaussian_numpy(8, 1.0), old_stream)


_CLAIM = """
import sys
from dpaudit.releasing import make_noise_source, read_noise_seed
for _ in range(int(sys.argv[2])):
    use = read_noise_seed(sys.argv[1])
    draw = make_noise_source(seed=0, secret_seed=use).gaussian_numpy(1, 1.0)[0]
    print(use.use, repr(float(draw)), flush=True)
if sys.argv[3] == "die":  # claims a use, draws from it, dies before recording any release
    import os
    os._exit(3)
"""


def _claims(seed_file, count: int, then: str = "exit") -> subprocess.Popen:
    cmd = [sys.executable, "-c", _CLAIM, str(seed_file), str(count), then]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def test_concurrent_processes_never_share_a_use(tmp_path):
    seed_file = tmp_path / "noise.seed"  # absent: the processes also race to create it
    procs = [_claims(seed_file, 5) for _ in range(4)]
    lines = [line.split() for p in procs for line in p.communicate(timeout=120)[0].splitlines()]
    assert all(p.returncode == 0 for p in procs)
    uses, draws = [int(u) for u, _ in lines], [d for _, d in lines]
    assert sorted(uses) == list(range(1, 21)) and len(set(draws)) == 20
    assert len({r["nonce"] for r in _records(seed_file)}) == 20


def test_a_dead_run_a_cut_record_or_a_copied_file_never_repeat_noise(tmp_path):
    seed_file = tmp_path / "noise.seed"
    dead = _claims(seed_file, 1, "die")
    (line,) = dead.communicate(timeout=120)[0].splitlines()
    assert dead.returncode == 3
    dead_use, dead_draw = line.split()
    with seed_file.open("a") as f:
        f.write('{"use": 7, "non')  # a claim cut short by a crash
    copy = tmp_path / "copy.seed"
    shutil.copy(seed_file, copy)  # same secret, same records
    after = [make_noise_source(seed=0, secret_seed=read_noise_seed(p)) for p in (seed_file, copy)]
    draws = [repr(float(n.gaussian_numpy(1, 1.0)[0])) for n in after]
    assert (
        int(dead_use) == 1 and read_noise_seed(seed_file).use == 3
    )  # the dead run's use stays used
    assert len({dead_draw, *draws}) == 3  # same use number in both files, still fresh noise (nonce)


def test_default_sources_are_fresh_for_every_release(tmp_path, digits):
    for kind in ("os-entropy", "cryptographic"):
        first, second = (NoiseSource(kind).gaussian_numpy(8, 1.0) for _ in range(2))
        assert not np.array_equal(first, second)
    requests = {
        name: NoisySumRequest(epsilon=eps, noise_source="cryptographic")
        for name, eps in (("a", 1.0), ("b", 2.0))
    }
    a, b = (
        release(
            "noisy-sum",
            requests[name],
            out_dir=tmp_path / name,
            ledger_path=tmp_path / "l.sqlite",
            prepared=digits,
        )
        for name in ("a", "b")
    )
    s1, s2 = a.noise_multiplier, b.noise_multiplier
    combined = (s2 * _released_sum(tmp_path / "a") - s1 * _released_sum(tmp_path / "b")) / (s2 - s1)
    assert np.linalg.norm(combined - clipped_rows(digits.x_train, 1.0).sum(axis=0)) > 1.0


def test_the_tasks_of_a_sweep_never_share_a_seed_files_noise(tmp_path, digits):
    from dpaudit.sweeps import open_store, parse_spec, run_sweep

    spec = parse_spec(
        'name = "two"\nmodels = ["noisy-sum"]\ndatasets = ["digits"]\nepsilons = [1.0, 2.0]\n'
        "seeds = [42]\n[settings]\ndelta = 1e-5\n"
    )
    seed_file = tmp_path / "noise.seed"
    with secret_noise_seed(seed_file):  # in-process tasks: each release is one use of the file
        summary = run_sweep(spec, out=tmp_path, ledger_path=tmp_path / "ledger.sqlite")
    assert (summary.done, summary.failed) == (2, 0)
    with open_store(tmp_path / "two", create=False) as st:
        done = sorted(
            (r.result for r in st.rows(status="done")), key=lambda r: r["noise_multiplier"]
        )
    (s1, folder1), (s2, folder2) = ((r["noise_multiplier"], Path(r["release_dir"])) for r in done)
    combined = (s2 * _released_sum(folder1) - s1 * _released_sum(folder2)) / (s2 - s1)
    assert np.linalg.norm(combined - clipped_rows(digits.x_train, 1.0).sum(axis=0)) > 1.0
    assert sorted(r["use"] for r in _records(seed_file) if "nonce" in r) == [1, 2]
