"""``report.html`` in a real browser (headless Chromium): plotly draws every panel, and clicking a run's legend entry hides that run in every panel.

Chromium is driven by its command line only: a script appended to a copy of the report clicks the
first legend entry the way a mouse does (plotly's legend reacts to mousedown + mouseup) and writes
each trace's visibility into the page title, which ``--dump-dom`` prints once the virtual time
budget (plotly's double-click delay included) has run out.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from retool.tracking.compare import RunSeries, build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
MEAN, MAJ = "val-core/aime_2024/acc/mean_at_4", "val-core/aime_2024/acc/maj_at_4/mean"

CLICK_FIRST_LEGEND_ENTRY = """
<script>
window.addEventListener('load', function () {
  var gd = document.getElementById('curves');
  var toggle = gd.querySelector('.legend .traces .legendtoggle');
  var box = toggle.getBoundingClientRect();
  var at = {bubbles: true, cancelable: true, clientX: box.left + 5, clientY: box.top + 5, button: 0, buttons: 1};
  toggle.dispatchEvent(new MouseEvent('mousedown', at));
  toggle.dispatchEvent(new MouseEvent('mouseup', at));
  setTimeout(function () {
    document.title = 'STATE' + JSON.stringify({panels: gd.querySelectorAll('.subplot').length,
      traces: gd.data.map(function (t) { return [t.legendgroup, t.visible === undefined ? true : t.visible]; })}) + 'END';
  }, 2000);
});
</script>
"""


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_the_legend_toggles_a_run_in_every_panel(tmp_path: Path) -> None:
    tool = RunSeries("tool", "1" * 32, "tool-integrated", {MEAN: {0: 0.1, 200: 0.5, 400: 0.7}, MAJ: {0: 0.2, 400: 0.75}, "tool/code_ratio": {1: 0.4, 400: 0.98}})
    text = RunSeries("text", "2" * 32, "text-only", {MEAN: {0: 0.1, 1080: 0.4}, MAJ: {0: 0.2, 1080: 0.45}})
    page = build_report([text, tool], smoothing=0.5).html
    (tmp_path / "report.html").write_text(page.replace("</body>", CLICK_FIRST_LEGEND_ENTRY + "</body>"), encoding="utf-8")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000", "--dump-dom", (tmp_path / "report.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"STATE(.*?)END", proc.stdout)
    assert found, proc.stderr[-2000:]
    state = json.loads(found.group(1).replace("&quot;", '"'))
    assert state["panels"] == 3
    visible = {group: {v for g, v in state["traces"] if g == group} for group in ("text", "tool")}
    assert visible == {"text": {"legendonly"}, "tool": {True}}, "the first entry (text) is hidden in all three panels, raw and smoothed lines alike"
