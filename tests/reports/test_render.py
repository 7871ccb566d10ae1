"""HTML / Markdown rendering: self-contained, all seven sections, figures, and a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from report_fixtures import make_release, synthetic_audit, write_audit_record

from dpaudit.reports import SECTIONS, build_report, write_report
from dpaudit.reports.plots import all_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    """Releases over three epsilons x 2 seeds + non-private, a sound and a broken audit, a ledger."""
    from dpaudit.ledger.book import open_ledger

    root = tmp_path_factory.mktemp("full")
    led = root / "ledger.sqlite"
    rels = []
    for nm, eps in ((12.0, 1.0), (6.0, 2.0), (3.5, 4.0)):
        for s in range(2):
            rels.append(make_release(root / "runs" / f"e{eps}-s{s}", noise_multiplier=nm, sample_rate=1.0, steps=5,
                                     target_epsilon=eps, seed=s, metrics={"accuracy": 0.7 + 0.05 * eps + 0.01 * s, "f1_macro": 0.6 + 0.05 * eps}))
    rels.append(make_release(root / "runs" / "np", non_private=True, metrics={"accuracy": 0.95, "f1_macro": 0.93}))
    with open_ledger(led) as L:
        for r in rels:
            if not r.non_private:
                L.record(r)
    ok, s_in, s_out = synthetic_audit(claimed_epsilon=rels[0].epsilon, shift=0.3)
    write_audit_record(root / "runs" / "audit-ok", ok, s_in, s_out)
    bad, b_in, b_out = synthetic_audit(claimed_epsilon=1.0, shift=5.0, mechanism="broken-gaussian")
    write_audit_record(root / "runs" / "audit-broken", bad, b_in, b_out)
    rep = build_report([root / "runs"], ledger_path=led, command="dpaudit report runs --ledger ledger.sqlite")
    return root, rep


@pytest.fixture(scope="module")
def rendered(full_report):
    """(report, figures, html text, markdown path): each figure drawn once for the module."""
    root, rep = full_report
    figs = all_figures(rep)
    html = write_report(rep, root / "report.html", fmt="html", figures=figs).read_text()
    md = write_report(rep, root / "md" / "rep.md", fmt="md", figures=figs)
    return rep, figs, html, md


def test_figures_are_pngs_for_every_kind(rendered):
    rep, figs, _, _ = rendered
    names = [f.name for f in figs]
    assert any(n.startswith("utility_") for n in names)
    assert "eps_lb_vs_claimed" in names
    assert sum(n.startswith("roc_") for n in names) == 2  # one per mechanism
    assert not any(n.startswith("hist_") for n in names)  # raw scores are local (issue 23 point 5): no score histogram
    assert all(f.png.startswith(PNG_MAGIC) and len(f.png) > 5000 for f in figs)


def test_html_is_self_contained_with_seven_sections(rendered):
    rep, figs, html, _ = rendered
    for key, heading in SECTIONS:
        assert f'<section id="{key}"' in html and heading in html
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html)  # only data URIs and in-page anchors
    assert "http://" not in html and "https://" not in html and "@import" not in html
    assert html.count("data:image/png;base64,") == len(figs)
    assert "@media print" in html
    assert "broken-gaussian: VIOLATION: eps_LB" in html
    assert "no evidence of a violation" in html
    assert "dpaudit report runs --ledger ledger.sqlite" in html


def test_markdown_writes_pngs_beside_it(rendered):
    _, _, _, out = rendered
    text = out.read_text()
    for _, heading in SECTIONS:
        assert f"## {heading}" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links and all(link.startswith("rep_files/") for link in links)
    for link in links:
        assert (out.parent / link).read_bytes().startswith(PNG_MAGIC)
    assert "VIOLATION: eps_LB" in text


def test_html_and_markdown_show_the_same_verdicts(rendered):
    import html as html_mod

    rep, _, html, md_path = rendered
    md = md_path.read_text()

    for v in rep["sections"]["verdict"]:
        assert v["line"] in md
        assert html_mod.escape(v["line"]) in html


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return None


@pytest.mark.slow
def test_html_renders_non_blank_in_headless_chromium(rendered, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium); headless rendering not checked")
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(rendered[2])
    shot = tmp_path / "shot.png"
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars"]
    run = subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists(), run.stderr[-2000:]
    img = Image.open(shot).convert("L")
    assert img.size == (1200, 2400)
    hist = img.histogram()
    dark = sum(hist[:128]) / (img.size[0] * img.size[1])
    assert dark > 0.01, "screenshot is blank"  # text, tables and the verdict boxes draw dark pixels
    assert sum(1 for c in hist if c) > 16  # more than a flat fill
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for key, heading in SECTIONS:
        assert f'id="{key}"' in dom and heading in dom
    assert "VIOLATION" in dom
