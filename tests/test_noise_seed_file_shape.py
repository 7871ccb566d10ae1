"""A new noise seed file: mode 0600 from its creation, one line of 64 hex digits, then its claims."""

from __future__ import annotations

import json
import stat

from dpaudit.releasing import read_noise_seed


def test_a_new_seed_file_holds_one_secret_line_then_the_claim(tmp_path):
    path = tmp_path / "noise.seed"
    use = read_noise_seed(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret, claim, *rest = path.read_text().split("\n")
    assert len(secret) == 64 and int(secret, 16) >= 0 and rest == [""]
    assert json.loads(claim)["use"] == use.use == 1
    assert not list(tmp_path.glob(".*"))  # the file written aside is gone
