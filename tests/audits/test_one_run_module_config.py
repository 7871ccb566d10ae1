"""A trainable-module release's one-run audit trains with the release's own DP-SGD config
(``config["dp_sgd"]`` of its plan: optimizer, momentum, learning rate, everything), not a rebuilt one."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.mechanisms.dpsgd import one_run_modules
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
from dpaudit.one_run_auditing import run_one_run
from dpaudit.records import read_release
from dpaudit.requests import AuditRequest


class _Trained(Exception):
    """Raised by the stand-in trainer once it has seen the config (the training itself is not under test)."""


def test_an_sgd_release_is_one_run_audited_with_sgd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(
        app,
        [
            "train",
            "dp-dense",
            "--eps",
            "2",
            "--epochs",
            "1",
            "--optimizer",
            "sgd",
            "--momentum",
            "0.5",
            "--out",
            "rel",
        ],
    )
    assert r.exit_code == 0, r.output
    release = read_release("rel")
    seen = []

    def trainer(module, x, y, config, **kw):
        seen.append(config)
        raise _Trained

    monkeypatch.setattr(one_run_modules, "train_module_dp_sgd", trainer)
    with pytest.raises(_Trained):
        audit = AuditRequest(mechanism="dp-dense", release="rel", one_run=True, canaries=10)
        run_one_run(audit, record=False)
    (config,) = seen
    assert (config.optimizer, config.momentum) == ("sgd", 0.5)
    assert config == DPSGDConfig.from_dict(release.config["dp_sgd"])
