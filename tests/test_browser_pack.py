"""The presentation pack in a real browser: the dashboard started by ``privacy-lab app`` (``python -m
engine app``) on a store holding a real, small IDP-SGD vs INO-SGD comparison; on Results drop one
figure from the picker, build the pack (its progress shows), download the zip and read it: at most
5 MB, one shared plotly.js that every HTML file loads, exactly the picked figures, data and configs.

Every wait polls the page with generous limits (a loaded 2-core machine); none sleeps a fixed time.
"""
from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import dies_with_this_process
from test_browser import CHROMIUM, UI_MS, _free_port, wait_healthy
from test_export import train_comparison

from engine.store.db import RunStore

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab-pack")
    store = RunStore(tmp / "runs.sqlite")
    ids = train_comparison(store, group_id="cmp-pack")
    port = _free_port()
    log = open(tmp / "app.log", "wb")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # preexec_fn: the app (and the streamlit it forwards SIGTERM to) ends with pytest, however pytest ends
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(store.path), "app", "--port", str(port),
                             "--browser.gatherUsageStats", "false"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=dies_with_this_process)
    url = f"http://127.0.0.1:{port}/"
    wait_healthy(url, proc, tmp / "app.log")
    yield url, ids
    proc.send_signal(signal.SIGTERM)  # `privacy-lab app` forwards it to streamlit and waits
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_pack_from_the_results_page(server, browser, tmp_path):
    from playwright.sync_api import expect

    url, ids = server
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page.set_default_timeout(UI_MS)
    page.goto(url)  # (deep links are issue 10 point 6: open Results through the navigation)
    page.get_by_role("link", name="Results").click()
    picker = page.locator(".stMultiSelect").filter(has_text="Figures in the pack")
    picker.wait_for()
    tags = picker.get_by_role("button", name=re.compile(r"^Remove "))  # one per picked figure
    expect(tags.first).to_be_visible()
    offered = tags.count()
    assert offered >= 10  # every figure of the comparison (fairness needs a sensitive attribute)
    # drop "Per-class recall" from the pack
    picker.get_by_role("button", name="Remove Per-class recall").click()
    expect(tags).to_have_count(offered - 1)

    page.get_by_role("button", name="Build presentation pack").click()
    download_button = page.get_by_role("button", name="Download pack (zip)")
    download_button.wait_for()
    expect(page.get_by_text(re.compile(r"Presentation pack ready: \d+ figures"))).to_be_visible()
    with page.expect_download() as info:
        download_button.click()
    path = tmp_path / "pack.zip"
    info.value.save_as(path)

    data = path.read_bytes()
    assert len(data) <= 5_000_000, f"{len(data) / 1e6:.1f} MB"
    z = zipfile.ZipFile(io.BytesIO(data))
    names = z.namelist()
    assert [n for n in names if n.endswith(".js")] == ["html/plotly.min.js"]
    htmls = sorted(n for n in names if n.endswith(".html"))
    assert len(htmls) == offered - 1 and not [n for n in htmls if "class_recall" in n]
    for n in htmls:
        assert re.findall(r'<script[^>]*\bsrc="([^"]+)"', z.read(n).decode()) == ["plotly.min.js"]
    stems = {n.split("/", 1)[1].rsplit(".", 1)[0] for n in htmls}
    assert {n.split("/", 1)[1].rsplit(".", 1)[0] for n in names if n.startswith("data/")} == stems
    for fmt in ("png", "svg"):
        assert {n.split("/", 1)[1].rsplit(".", 1)[0] for n in names if n.startswith(f"{fmt}/")} == stems
    assert "configs.json" in names
    page.close()
