"""`lmi bench http` writes, beside its tables, a self-contained HTML report with plots (TTFT,
inter-token and E2E latency distributions, tokens/s over time, throughput against
concurrency). The report is opened in
headless Chromium (as the chat page test drives it): every plot must render as an SVG of
non-zero size with drawn marks, and the page must load nothing from elsewhere."""

import os
import subprocess
import tempfile

import pytest

from test_chat_page import _driver


def test_bench_http_report_renders_its_plots_in_chromium(url, tmp_path):
    binary = os.environ.get("LMI_BIN")
    if not binary:
        pytest.fail("LMI_BIN is not set: these tests run from crates/server/tests/clients.rs")
    report = tmp_path / "report.html"
    r = subprocess.run(
        [binary, "bench", "http", "--url", url, "--concurrency", "1,2", "--requests", "4",
         "--warmup", "0", "--prompt-len", "8", "--max-new-tokens", "8",
         "--report", str(report)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"report: {report}" in r.stdout
    html = report.read_text()
    assert "<script" not in html and "src=" not in html, "the report must be self-contained"

    from selenium.webdriver.common.by import By

    with tempfile.TemporaryDirectory() as profile:
        d = _driver(profile)
        try:
            d.get(report.as_uri())
            figures = d.find_elements(By.CSS_SELECTOR, "figure.chart")
            captions = [f.find_element(By.TAG_NAME, "figcaption").text for f in figures]
            assert len(figures) == 5, captions
            for want in ["Output tokens/s against concurrency", "Time to first token",
                         "Inter-token latency", "End-to-end latency", "Output tokens/s over time"]:
                assert any(c.startswith(want) for c in captions), (want, captions)
            for f, caption in zip(figures, captions):
                svg = f.find_element(By.TAG_NAME, "svg")
                size = svg.size
                assert size["width"] > 100 and size["height"] > 100, (caption, size)
                # Marks drawn: histogram bars, or the line and its points.
                bars = d.execute_script(
                    "return Array.from(arguments[0].querySelectorAll('rect'))"
                    ".filter(r => r.getBBox().height > 0 && r.getBBox().width > 0"
                    " && r.getBBox().width < arguments[0].getBBox().width - 1).length", svg)
                lines = d.execute_script(
                    "return Array.from(arguments[0].querySelectorAll('polyline'))"
                    ".filter(p => p.getBBox().width > 0).length", svg)
                assert bars > 0 or lines > 0, f"{caption}: nothing drawn"
                labels = [t.text for t in svg.find_elements(By.TAG_NAME, "text")]
                assert any(labels), f"{caption}: no axis labels"
        finally:
            d.quit()
