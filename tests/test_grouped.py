"""One rule for grouped fields: requests and records give, read and change a group's members by
their own names, and read the group as a record of its own."""

import dataclasses

import pytest

from dpaudit.requests import AuditRequest, DPSGDRequest


def test_a_requests_grouped_option_reads_by_its_own_name_and_through_its_group():
    request = AuditRequest("dp-rvfl", workers=3, epochs=2, ledger="l.sqlite")
    assert request.workers == request.trials.workers == 3
    assert request.epochs == request.settings.epochs == 2 and request.ledger == "l.sqlite"
    changed = dataclasses.replace(request, workers=4)
    assert (changed.trials.workers, changed.settings.epochs) == (4, 2)
    assert DPSGDRequest("dp-cnn", device="cuda").device == "cuda"
    with pytest.raises(AttributeError):
        request.bogus
    with pytest.raises(TypeError, match="AuditRequest has no field bogus"):
        AuditRequest("dp-rvfl", bogus=1)


def test_a_grouped_record_is_its_constructor_over_flat_keys():
    request = AuditRequest("dp-rvfl", workers=3)
    assert AuditRequest.of(mechanism="dp-rvfl", workers=3) == request
    assert request.replace(workers=5) == AuditRequest("dp-rvfl", workers=5)
    assert set(request.flat()) == AuditRequest.flat_names() == set(request.to_dict())
