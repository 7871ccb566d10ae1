"""What ``dpaudit train dp-elm`` prints before and after a release: the notes (the textbook
warning first) and the summary's fields in order, as the code before a restructuring wrote them."""

from __future__ import annotations

from dpaudit.mechanisms.elm.mechanism import MECHANISM
from dpaudit.releasing import release
from dpaudit.requests import DPELMRequest

SCALE = "noise scale L(L+2)/eps = 7.5 on every entry of H^T H and H^T Y (L=3, eps=2)"
WARNING = (
    "[yellow]warning:[/] the textbook Laplace sampler leaks through floating-point low bits "
    "(Mironov 2012); the release is marked certified: false."
)
NON_PRIVATE = (
    "[yellow]non-private:[/] closed-form ELM without noise; the release makes no privacy claim."
)
SUMMARY_FIELDS = [
    "mechanism",
    "dataset",
    "width",
    "noise_scale",
    "sampler",
    "sampler_certified",
    "adjacency",
    "accountant",
    "target_epsilon",
    "epsilon",
    "delta",
    "noise_source",
    "seed",
    "solver",
    "metrics",
    "timings",
    "release_id",
    "release",
]


def test_notes_put_the_textbook_warning_before_the_noise_scale():
    assert MECHANISM.notes(DPELMRequest(width=3, sampler="textbook")) == [WARNING, SCALE]
    assert MECHANISM.notes(DPELMRequest(width=3)) == [SCALE]
    assert MECHANISM.notes(DPELMRequest(width=3, non_private=True)) == [NON_PRIVATE]


def test_summary_lists_its_fields_in_order(tmp_path):
    r = release(
        "dp-elm", DPELMRequest(width=3, reproducible_noise=True), out_dir=tmp_path, record=False
    )
    fields, lines = MECHANISM.summary(r)
    assert list(fields) == SUMMARY_FIELDS
    assert (fields["width"], fields["noise_scale"], fields["sampler"]) == (
        3,
        7.5,
        "discrete-laplace",
    )
    assert lines[0].startswith("[bold]dp-elm[/] on digits: L=3, noise scale 7.5, sampler discrete")
