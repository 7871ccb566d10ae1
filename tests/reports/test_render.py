"""HTML / Markdown rendering: self-contained, all seven sections, figures, and a real browser."""

from __future__ import annotations

import html as html_mod
import json
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
            rels.append(
                make_release(
                    root / "runs" / f"e{eps}-s{s}",
                    noise_multiplier=nm,
                    sample_rate=1.0,
                    steps=5,
                    target_epsilon=eps,
                    seed=s,
                    metrics={"accuracy": 0.7 + 0.05 * eps + 0.01 * s, "f1_macro": 0.6 + 0.05 * eps},
                )
            )
    rels.append(
        make_release(
            root / "runs" / "np", non_private=True, metrics={"accuracy": 0.95, "f1_macro": 0.93}
        )
    )
    with open_ledger(led) as L:
        for r in rels:
            if not r.non_private:
                L.record(r)
    ok, s_in, s_out = synthetic_audit(claimed_epsilon=rels[0].epsilon, shift=0.3)
    write_audit_record(root / "runs" / "audit-ok", ok, s_in, s_out)
    bad, b_in, b_out = synthetic_audit(claimed_epsilon=1.0, shift=5.0, mechanism="broken-gaussian")
    write_audit_record(root / "runs" / "audit-broken", bad, b_in, b_out)
    rep = build_report(
        [root / "runs"], ledger_path=led, command="dpaudit report runs --ledger ledger.sqlite"
    )
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
    assert not any(n.startswith("hist_") for n in names)  # raw scores are local: no score histogram
    assert all(f.png.startswith(PNG_MAGIC) and len(f.png) > 5000 for f in figs)


def test_html_is_self_contained_with_seven_sections(rendered):
    rep, figs, html, _ = rendered
    for key, heading in SECTIONS:
        assert f'<section id="{key}"' in html and heading in html
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert not re.search(
        r"""(src|href)=["'](?!data:|#)""", html
    )  # only data URIs and in-page anchors
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
    rep, _, html, md_path = rendered
    md = md_path.read_text()

    for v in rep["sections"]["verdict"]:
        assert v["line"] in md
        assert html_mod.escape(v["line"]) in html


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


#: Run in a copy of the page (the report itself has no script): where the verdict table lies on
#: the first screen as served, then, with every section and note unfolded, whether anything is
#: wider than the window. The answer is written into the title, read back with --dump-dom.
PROBE = """<script>
const r = document.querySelector('#verdict table').getBoundingClientRect();
const out = {top: r.top, bottom: r.bottom, right: r.right, w: innerWidth, h: innerHeight, scroll: document.documentElement.scrollWidth};
document.querySelectorAll('details').forEach(d => { d.open = true; });
out.open_scroll = document.documentElement.scrollWidth;
out.wide = [...document.querySelectorAll('table, figure, pre')].filter(x => x.getBoundingClientRect().right > innerWidth)
  .map(x => (x.textContent || '').slice(0, 60));
document.title = JSON.stringify(out);
</script>"""


@pytest.mark.slow
def test_verdict_table_fits_the_first_screen_of_a_1280x800_browser(rendered, tmp_path):
    """Headless Chromium at 1280x800: the screenshot is not blank, the verdict table lies wholly
    inside the first screen, and no table, figure or code block is wider than the page (no
    sideways scroll) with every section unfolded."""
    browser = _chromium()
    if browser is None:
        pytest.skip(
            "chromium not installed (Debian: apt-get install -y chromium); the report was not checked in a browser"
        )
    from PIL import Image

    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--hide-scrollbars",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,800",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    page, probe, shot = tmp_path / "report.html", tmp_path / "probe.html", tmp_path / "shot.png"
    page.write_text(rendered[2])
    probe.write_text(rendered[2].replace("</body>", PROBE + "</body>"))
    run = subprocess.run(
        flags + [f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert shot.exists(), run.stderr[-2000:]
    img = Image.open(shot).convert("L")
    assert img.size == (1280, 800)
    hist = img.histogram()
    assert sum(hist[:128]) / (1280 * 800) > 0.01 and sum(1 for c in hist if c) > 16, (
        "screenshot is blank"
    )
    dom = subprocess.run(
        flags + ["--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    m = re.search(r"<title>(\{.*?\})</title>", dom)
    assert m, dom[:500]
    got = json.loads(html_mod.unescape(m.group(1)))
    # the whole table on the first screen (the screenshot's 800 px; --dump-dom's innerHeight is the window less its frame)
    assert got["w"] == 1280 and 0 <= got["top"] and got["bottom"] <= 800 and got["right"] <= 1280, (
        got
    )
    assert got["scroll"] <= 1280 and got["open_scroll"] <= 1280 and not got["wide"], json.dumps(
        got
    )  # nothing scrolls sideways
    for key, heading in SECTIONS:
        assert f'id="{key}"' in dom and heading in dom
    assert "VIOLATION" in dom


def test_first_table_has_a_row_per_release_in_both_formats(rendered):
    """The verdict table comes first, a row per release (and one per audit that covers none), with the
    same cells in HTML and Markdown; warnings fold into one line."""
    from dpaudit.reports.blocks import FIRST_HEADERS, layout

    rep, _, html, md_path = rendered
    md = md_path.read_text()
    (key, _, blocks), *_ = layout(rep)
    first = blocks[0]
    assert key == "verdict" and first.kind == "table" and first.headers == FIRST_HEADERS
    ids = [r["id"] for r in rep["inputs"]["releases"]]
    unlinked = [e for e in rep["sections"]["audit"]["audits"] if not e["covers_releases"]]
    assert (
        len(unlinked) == 2 and len(first.rows) == len(ids) + 2
    )  # + a row per audit that records no release
    for rid in ids:
        assert sum(row[0].endswith(rid[:8]) for row in first.rows) == 1
    broken = next(row for row in first.rows if row[0].startswith("broken-gaussian"))
    assert (
        sum(
            row[0] == "dp-rvfl (no release)" and row[4] == "no evidence of a violation"
            for row in first.rows
        )
        == 1
    )
    assert broken[0] == "broken-gaussian (no release)" and broken[4].startswith("VIOLATION")
    assert sum(row[4] == "no claim (non-private)" for row in first.rows) == 1
    head = "| " + " | ".join(FIRST_HEADERS) + " |"
    assert md.index(head) < md.index("## 2.") and md.index(head) < md.index("<details><summary>")
    assert (
        html.index("Verdict per release")
        < html.index('<details class="notes">')
        < html.index('id="claim"')
    )
    assert "<summary>" in html and re.search(r"\d+ warnings?[^<]*\(expand\)</summary>", html)
