"""An interrupted `dpaudit train` closes its budget reservation and says what it kept and released.

A real signal to a real process: the command is started on the embedded digits data with more
epochs than the test waits for, the signal is sent once the ledger holds its open reservation,
and the exit status, the one stderr line and the ledger's state are checked. SIGTERM is handled
like Ctrl-C: nothing was published, so the reservation is cancelled (not left open, spent).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from dpaudit.ledger.book import open_ledger

#: Training runs for minutes at this size; the test stops it within seconds of its reservation.
_EPOCHS = "50000"


def _start_train(tmp_path):
    led = tmp_path / "ledger.sqlite"
    cmd = [
        sys.executable,
        "-c",
        "from dpaudit.cli import main; main()",
        "train",
        "dp-rvfl",
        "--dataset",
        "digits",
        "--eps",
        "1",
        "--epochs",
        _EPOCHS,
        "--ledger",
        str(led),
        "--out",
        str(tmp_path / "run"),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    return proc, led


def _interruptible() -> None:
    # A suite started in the background by a non-interactive shell runs with SIGINT ignored, and
    # a child inherits that: Python then never installs its Ctrl-C handler. A user's terminal
    # does not ignore it, so the command under test starts with the default disposition.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_open_reservation(proc, led, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"train ended before it was interrupted: {proc.communicate()[1][-2000:]}")
        if led.exists():
            with open_ledger(led, create=False) as ledger:
                held = ledger.open_reservations()
            if held:
                return held[0].id
        time.sleep(0.2)
    proc.kill()
    pytest.fail("no reservation appeared in the ledger")


@pytest.mark.parametrize(
    "signum, name, status",
    [
        (signal.SIGTERM, "SIGTERM", 128 + signal.SIGTERM),
        (signal.SIGINT, "SIGINT", 128 + signal.SIGINT),
    ],
)
def test_an_interrupted_train_cancels_its_reservation_and_says_so(tmp_path, signum, name, status):
    proc, led = _start_train(tmp_path)
    rid = _wait_for_open_reservation(proc, led)
    time.sleep(0.5)  # well inside training (the reservation comes right before it)
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{name} did not stop train")
    tail = (proc.returncode, err[-2000:])
    assert proc.returncode == status, (
        tail
    )  # 128 + the signal, as a shell reports a process it killed
    lines = [line for line in err.splitlines() if line.startswith("dpaudit: interrupted")]
    said = f"dpaudit: interrupted ({name}): reservation {rid} cancelled, nothing was released."
    assert lines == [said], tail
    with open_ledger(led, create=False) as ledger:
        assert ledger.open_reservations() == []  # not left spent
        assert ledger.get(rid).status == "cancelled"
        assert [e.kind for e in ledger.entries() if e.kind == "release"] == []
    assert not (tmp_path / "run" / "release.json").exists()


def test_an_interrupt_after_release_files_were_written_keeps_the_budget_spent(
    tmp_path, monkeypatch, capsys
):
    from dpaudit import releasing
    from dpaudit.data import load_dataset
    from dpaudit.mechanisms.simple.noisy_sum import NoisySumRequest

    def interrupted(
        *args, **kwargs
    ):  # Ctrl-C after the weights file is written, before release.json
        raise KeyboardInterrupt

    monkeypatch.setattr(releasing, "publish", interrupted)
    led, seed_file = tmp_path / "l.sqlite", tmp_path / "noise.seed"
    with releasing.secret_noise_seed(seed_file), pytest.raises(KeyboardInterrupt):
        releasing.release(
            "noisy-sum",
            NoisySumRequest(),
            out_dir=tmp_path / "r",
            ledger_path=led,
            prepared=load_dataset("digits"),
        )
    assert (tmp_path / "r" / "sum.npz").exists()
    with open_ledger(led, create=False) as ledger:
        (held,) = ledger.open_reservations()  # noisy output may exist: counted as spent
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"dpaudit: interrupted (SIGINT): reservation {held.id} kept as spent because release "
        f"files may have been written to {tmp_path / 'r'} (delete them, then `dpaudit ledger void "
        f"{held.id} --reason ...`); noise seed use 1 of {seed_file.resolve()} stays used "
        f"(never drawn from again)."
    ]
