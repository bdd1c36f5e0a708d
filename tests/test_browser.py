"""The dashboard in a real browser: Playwright drives Debian's Chromium (headless) against
``streamlit run app.py`` on 127.0.0.1 with a temporary run store.

Open the app, launch an IDP-SGD vs INO-SGD comparison on digits, watch the live MID chart gain points,
cancel one run (its worker really stops), SIGKILL the other's worker and see it marked interrupted
while the app keeps working, export a PNG and check it; screenshots go to docs/screenshots/ (README).

Every wait polls the app's state (the store, the page's DOM) with generous limits, so that the tests pass
on a slow or loaded 2-core machine; none sleeps for a fixed time. The limits only bound a failure.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from pathlib import Path

import pytest

from conftest import ON_TIMEOUT, dies_with_this_process, wait_until
from engine.store.db import ACTIVE, RunStore
from engine.store.liveness import pid_alive

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
# Screenshots go to a temporary folder made at the first one and removed when the tests end: a test run leaves the
# checkout and the system's temporary folder as they were. The README's screenshots are refreshed on purpose:
# PRIVACY_LAB_SCREENSHOTS=docs/screenshots python -m pytest -q tests/test_browser*.py
SHOTS_FOR_README = bool(os.environ.get("PRIVACY_LAB_SCREENSHOTS"))
_SHOTS: list[Path] = []


def shot_path(name: str) -> Path:
    """Where screenshot ``name`` goes (docs/screenshots/ when refreshing the README's, else a temporary folder)."""
    if not _SHOTS:
        if SHOTS_FOR_README:
            _SHOTS.append(ROOT / os.environ["PRIVACY_LAB_SCREENSHOTS"])
            _SHOTS[0].mkdir(parents=True, exist_ok=True)
        else:
            _SHOTS.append(Path(tempfile.mkdtemp(prefix="privacy-lab-screenshots-")))
            atexit.register(shutil.rmtree, _SHOTS[0], ignore_errors=True)
    return _SHOTS[0] / name
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

UI = 240.0  # seconds for the page to show something (a button, a chart, a status) under load
UI_MS = int(UI * 1000)
RUN = 600.0  # seconds for a short run or audit to finish under load

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"the browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_lab(tmp: Path, **env_extra) -> tuple[subprocess.Popen, str]:
    """``streamlit run app.py`` on a free port with the run store in ``tmp``; returns (process, URL) at once
    (:func:`start_lab` waits until it is healthy)."""
    port = _free_port()
    env = dict(os.environ, PRIVACY_LAB_STORE=str(tmp / "runs.sqlite"), PYTHONPATH=str(ROOT), **env_extra)
    if SHOTS_FOR_README:  # the sidebar then reads "Store: ~/runs.sqlite" in the README's screenshots
        env["HOME"] = str(tmp)
    log = open(tmp / "streamlit.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=dies_with_this_process)  # ends with pytest, however pytest ends
    return proc, f"http://127.0.0.1:{port}/"


def start_lab(tmp: Path, **env_extra) -> tuple[subprocess.Popen, str]:
    """``streamlit run app.py`` on a free port with the run store in ``tmp``; returns (process, URL) once healthy."""
    proc, url = spawn_lab(tmp, **env_extra)
    try:
        wait_healthy(url, proc, tmp / "streamlit.log")
    except BaseException:
        stop_lab(proc)
        raise
    return proc, url


def stop_lab(proc: subprocess.Popen, store: RunStore | None = None) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(15)
    for run in store.list_runs(status="running") if store is not None else []:  # workers are separate processes
        if run["pid"] and pid_alive(run["pid"]):
            os.kill(run["pid"], signal.SIGTERM)


@pytest.fixture(scope="module")
def server(lab):
    """The shared app (``lab``, tests/conftest.py) for one module: ``(url, store, tmp)``. At the module's end
    every run it left queued or running is stopped, so the next module's launches find the workers free."""
    url, store, _ = lab
    with reporting_runs(store):
        yield lab
        stop_runs(store)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory, request):
    """The module's own app on a fresh store: ``(url, store, tmp)``, for a page that must find no run at all or a
    layout checked with known content. A module whose own app never launches a run sets ``TRAINS = False``: that
    server starts no standby workers (two processes importing torch for nothing)."""
    tmp = tmp_path_factory.mktemp("lab-own")
    proc, url = start_lab(tmp, **({} if getattr(request.module, "TRAINS", True) else {"PRIVACY_LAB_PREWARM": "0"}))
    store = RunStore(tmp / "runs.sqlite")
    try:
        with reporting_runs(store):
            yield url, store, tmp
    finally:
        stop_lab(proc, store)


def stop_runs(store: RunStore) -> None:
    """Stop every run of ``store`` that is queued (marked cancelled) or running (its worker gets SIGTERM, as the
    page's Cancel sends), and wait until none is left active (the app notices its workers end)."""
    signalled: set[int] = set()

    def stopped() -> bool:
        active = [r for r in store.list_runs() if r["status"] in ACTIVE]
        for r in active:
            if r["status"] == "queued":
                store.set_status(r["id"], "cancelled")
            elif r["pid"] and r["pid"] not in signalled and pid_alive(r["pid"]):
                signalled.add(r["pid"])
                os.kill(r["pid"], signal.SIGTERM)
        return not active

    wait_until(stopped, UI, "the module's runs to stop", interval=0.5)


@contextlib.contextmanager
def reporting_runs(store: RunStore):
    """Inside the block a timed-out wait (conftest.wait_until) also says the runs of ``store`` and their states."""
    def runs() -> str:
        rows = [(r["id"], r["algorithm"], r["status"], r["step"], r["error"]) for r in store.list_runs()]
        return f"runs: {rows}"

    ON_TIMEOUT.append(runs)
    try:
        yield
    finally:
        ON_TIMEOUT.remove(runs)


def wait_healthy(url: str, proc, log_path: Path, timeout: float = UI) -> None:
    """Poll the Streamlit server's health endpoint until it answers (or its process died / time ran out)."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(log_path.read_text()[-3000:])
            time.sleep(0.25)


def click_until(button, pred, what: str, timeout: float = UI, retry: float = 10.0):
    """Click ``button`` until ``pred()`` holds: the live fragment redraws the page twice a second, and a
    click that lands while its button is being replaced is lost (a user clicks again)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if button.count() == 1 and button.is_enabled():
                button.click(timeout=5000)
        except Exception:  # replaced while clicking: try again
            pass
        try:
            return wait_until(pred, min(retry, max(0.0, deadline - time.time())), what)
        except AssertionError:
            continue
    raise AssertionError(f"timed out waiting for {what}")


def run_ids(store: RunStore) -> set[int]:
    """The ids of the runs in ``store`` now (the browser modules share one store: a test compares with these)."""
    return {r["id"] for r in store.list_runs()}


def new_runs(store: RunStore, before: set[int]) -> list[dict]:
    """The runs of ``store`` whose ids are not in ``before`` (:func:`run_ids` earlier), oldest first."""
    return sorted((r for r in store.list_runs() if r["id"] not in before), key=lambda r: r["id"])


def cancel_all(page, store) -> None:
    """Stop every run of the store that is still queued or running with its Cancel button on the page (each
    click retried until the store says it stopped)."""
    for r in sorted(store.list_runs(), key=lambda r: r["id"]):
        cancel = page.locator(f".st-key-cancel-{r['id']} button")
        if store.get_run(r["id"])["status"] in ("queued", "running") and cancel.count():
            click_until(cancel, lambda rid=r["id"]: store.get_run(rid)["status"] not in ("queued", "running"),
                        f"run {r['id']} to stop")


def outside_figure(page, key: str) -> list[str] | None:
    """The texts of chart ``key`` (title, annotations) whose box reaches outside the figure (None: not drawn)."""
    return page.evaluate("""key => {
        const svg = document.querySelector(`.st-key-chart-${key} svg.main-svg`);
        if (!svg) return null;
        const f = svg.getBoundingClientRect();
        const texts = [...document.querySelectorAll(`.st-key-chart-${key} .gtitle, .st-key-chart-${key} .annotation-text`)];
        if (!texts.length) return null;
        return texts.filter(t => { const b = t.getBoundingClientRect();
            return b.left < f.left - 1 || b.right > f.right + 1 || b.top < f.top - 1; }).map(t => t.textContent);
    }""", key)


def points(chart) -> int:
    return chart.locator(".scatterlayer path.point").count()


def last_plotted_x(chart) -> float:
    """The largest x (a step) Plotly draws in ``chart`` (a chart's locator), -1 while it draws nothing. How a live
    chart shows new evaluations: a curve longer than ``MAX_DRAWN_POINTS`` (engine/figures/scaffold.py) is drawn
    thinned to that many points, so it grows at its end, not in its count of points."""
    plot = chart.locator(".js-plotly-plot")
    try:
        return plot.first.evaluate("""gd => {
            let m = -1;
            for (const cd of gd.calcdata || []) for (const p of cd) if (typeof p.x === 'number' && p.x > m) m = p.x;
            return m;
        }""", timeout=5000) if plot.count() else -1
    except Exception:  # noqa: BLE001 - the div is being redrawn: read it again
        return -1


def shot(page, name: str, locator=None) -> None:
    if locator is not None:
        locator.scroll_into_view_if_needed()
        locator.wait_for(state="visible")
    page.screenshot(path=str(shot_path(name)))


DEEP_LINKS = {"train": "Train / compare", "results": "Results", "runs": "Runs", "tif": "TIF explorer",
              "audit": "Privacy audit"}
# what a page would be called if Streamlit listed app_pages/'s files (its legacy multipage mode names pages
# after their files): never in the navigation
FILE_PAGE_NAMES = sorted({p.stem.strip("_").replace("_", " ") for p in (ROOT / "app_pages").glob("*.py")})


def goto_deep_link(browser, url: str, path: str):
    """A new tab on ``url + path`` (returned as soon as the document has loaded: the app renders after)."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.set_default_timeout(UI_MS)
    page.goto(url + path)
    return page


def check_deep_link(page, url: str, path: str) -> None:
    """The tab shows its page's heading, at that URL, inside the app's navigation (never a page named after a
    file of app_pages/, never Streamlit's "Page not found" dialog and its redirect to /); then it is closed."""
    page.get_by_role("heading", name=DEEP_LINKS[path or "train"]).first.wait_for()  # "/": Train
    nav = page.locator('[data-testid="stSidebarNav"]')
    nav.get_by_text("Train / compare").wait_for()
    assert page.get_by_text("Page not found").count() == 0, path
    assert page.url.split("?")[0] == url + path, (path, page.url)
    assert nav.get_by_text("Audit", exact=True).count() == 1
    for name in FILE_PAGE_NAMES:
        assert nav.get_by_text(name, exact=True).count() == 0, name
    page.close()


def open_deep_link(browser, url: str, path: str) -> None:
    check_deep_link(goto_deep_link(browser, url, path), url, path)


def test_each_deep_link_is_the_first_visit_of_a_fresh_server(browser, tmp_path):
    """Each page's URL as the very first visit of its own server process (its health check runs no script, so
    nothing has run app.py there before). The servers start together and the five first visits load
    together: the test takes about as long as one. No standby workers: nothing trains."""
    labs = {}
    try:
        for path in DEEP_LINKS:
            (tmp_path / path).mkdir()
            labs[path] = spawn_lab(tmp_path / path, PRIVACY_LAB_PREWARM="0")
        for path, (proc, url) in labs.items():
            wait_healthy(url, proc, tmp_path / path / "streamlit.log")
        tabs = {path: goto_deep_link(browser, url, path) for path, (_, url) in labs.items()}
        for path, tab in tabs.items():
            check_deep_link(tab, labs[path][1], path)
    finally:
        for proc, _ in labs.values():
            stop_lab(proc)


def test_deep_links_on_a_running_server(server, browser):
    url = server[0]
    open_deep_link(browser, url, "")  # "/" (the hidden default page, Train): app.py's navigation has run
    for path in DEEP_LINKS:
        open_deep_link(browser, url, path)


def test_live_comparison_cancel_kill_and_export(server, browser):
    url, store, _ = server
    page = browser.new_page(viewport={"width": 1440, "height": 1300}, accept_downloads=True)
    page.set_default_timeout(UI_MS)
    # settings come from the URL: 1000 epochs of digits keep each run busy for long (both get stopped)
    page.goto(url + "train?dataset=digits&batch=64&epochs=1000&eval_every=10")
    page.get_by_role("button", name="Got it").click()  # the first-visit explanation
    launch = page.get_by_role("button", name="Launch comparison")
    wait_until(lambda: launch.is_enabled(), UI, "the launch button")
    shot(page, "train_form.png")

    before = run_ids(store)  # (the store is shared with the other browser modules)
    launch.click()
    first, second = wait_until(lambda: len(new := new_runs(store, before)) == 2 and new, UI, "two runs in the store")
    assert (first["algorithm"], second["algorithm"]) == ("idp_sample", "ino")
    chart = page.locator(".st-key-chart-live-mid")
    # the live MID chart shows the first run's facet and gains points while it runs
    wait_until(lambda: chart.get_by_text(f"#{first['id']}").count() and points(chart) > 0, UI, "a first live point")
    x0 = last_plotted_x(chart)
    wait_until(lambda: last_plotted_x(chart) > x0, UI, f"the live curves to reach past step {x0}")
    assert store.get_run(first["id"])["status"] == "running"
    status = page.locator(".st-key-live-status")
    # at least two workers (engine.jobs.manager.default_max_workers): the comparison's runs train side by side
    wait_until(lambda: store.get_run(second["id"])["status"] in ("running", "finished"), UI, "the second run started")
    shot(page, "train_live.png", chart)

    # Cancel really stops the worker; its metrics stay
    pid = store.get_run(first["id"])["pid"]
    cancel = page.locator(f".st-key-cancel-{first['id']} button")
    click_until(cancel, lambda: store.get_run(first["id"])["status"] != "running", "Cancel to stop the run")
    wait_until(lambda: status.get_by_text("cancelled").count(), UI, "the run marked cancelled")
    assert store.get_run(first["id"])["status"] == "cancelled"
    wait_until(lambda: not pid_alive(pid), UI, "the cancelled worker to exit")
    assert store.eval_metrics(first["id"])

    # kill -9 the other run's worker: the run becomes interrupted, the app stays up
    run2 = wait_until(lambda: (r := store.get_run(second["id"]))["status"] == "running" and r["step"] > 0 and r,
                      RUN, "the second run to train")
    os.kill(run2["pid"], signal.SIGKILL)
    wait_until(lambda: status.get_by_text("interrupted").count(), UI, "the run marked interrupted")
    assert store.get_run(second["id"])["status"] == "interrupted"
    assert "SIGKILL" in store.get_run(second["id"])["error"], store.get_run(second["id"])["error"]
    shot(page, "train_cancelled_interrupted.png", status)

    # the app keeps working: a short comparison runs to the end
    page.goto(url + "train?dataset=digits&batch=64&epochs=4")
    launch = page.get_by_role("button", name="Launch comparison")
    wait_until(lambda: launch.is_enabled(), UI, "the launch button")
    assert page.locator(".st-key-intro-box").count() == 0  # dismissed at the start: it stays dismissed
    before = run_ids(store)
    launch.click()
    wait_until(lambda: len(new := new_runs(store, before)) == 2 and all(r["status"] == "finished" for r in new),
               RUN, "the new comparison to finish")
    status = page.locator(".st-key-live-status")
    wait_until(lambda: status.get_by_text("finished").count() == 2, UI, "both runs shown finished")
    shot(page, "train_finished.png", page.locator(".st-key-chart-live-mid"))

    # Results (same browser session, via the navigation): export a PNG from a figure's Export menu
    page.get_by_role("link", name="Results").click()
    budget = page.locator(".st-key-chart-res-budget")
    wait_until(lambda: points(budget) >= 20, UI, "the recall-vs-budget scatter")
    shot(page, "results.png")
    # the half-width charts' titles and notes are wrapped to fit: none reaches past its figure (Plotly clips them)
    for key in ("res-mid", "res-gain-time"):
        wait_until(lambda k=key: outside_figure(page, k) == [], UI, f"{key}'s texts inside its figure")
    budget.get_by_role("button", name="Export").click()
    png_button = page.locator('[data-testid="stPopoverBody"]').get_by_role("button", name="PNG")
    with page.expect_download(timeout=UI_MS) as download:
        png_button.click()
    data = Path(download.value.path()).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        assert im.size[0] >= 1000 and im.size[1] >= 600
    page.keyboard.press("Escape")

    # Runs: the whole history with statuses
    page.get_by_role("link", name="Runs").click()
    table = page.locator(".st-key-runs-table")
    wait_until(lambda: table.count() and table.is_visible(), UI, "the runs table")
    shot(page, "runs.png")
    page.close()


def test_tif_explorer_in_dark_mode(server, browser):
    url, _, _ = server
    page = browser.new_page(viewport={"width": 1440, "height": 1100}, color_scheme="dark")
    page.set_default_timeout(UI_MS)
    page.goto(url + "tif?x_shape=beta&x_alpha=2.0&x_beta=0.5&x_tail_pct=60")  # settings from the URL
    bif = page.locator(".st-key-chart-x-bif")
    wait_until(lambda: points(bif) > 10, UI, "the BIF chart")
    # moving a control redraws without training: change the shape, the chart follows
    page.get_by_role("button", name="Got it").click()
    page.locator(".st-key-intro-box").wait_for(state="detached")
    # the rerun moved every element up: wait until the old copies are gone
    wait_until(lambda: page.locator(".st-key-x_shape").count() == 1, UI, "the page to settle")
    assert page.locator(".st-key-x_alpha [data-disabled='true']").count() == 0  # Beta: α and β apply
    page.locator(".st-key-x_shape").get_by_role("radio", name="linear").click()
    wait_until(lambda: "x_shape=linear" in page.url, UI, "the URL to follow the shape")
    wait_until(lambda: page.locator(".st-key-x_alpha [data-disabled='true']").count(),
               UI, "α to be greyed out for the linear TIF")
    # γ = 60 % of the expected batch clip mass 64 = 38.4; the linear TIF drops γ/2 = 19.2 per full batch
    wait_until(lambda: page.get_by_text("19.200").count() >= 1 and points(bif) > 10, UI, "the redrawn chart")
    shot(page, "tif_explorer_dark.png")
    page.close()


def app_idle(page) -> bool:
    """The page's script run has ended (Streamlit marks its state on the app's root element)."""
    return page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').count() == 1


class Reruns:
    """The script runs of a page as its websocket to the app carries them, in the order they happened: the
    browser sends a ``rerun_script`` request (a widget changed) and the server later sends ``script_finished``.
    Watching them, a test waits for exactly the rerun its input caused, however quick: the page's own running
    mark (:func:`app_idle`) can go up and down before a test looks, and was waited for with a fixed timeout."""

    def __init__(self, page):
        self.page = page
        self.events: list[tuple[str, object]] = []  # ("sent", fragment id or "") / ("finished", status)
        page.on("websocket", self._socket)

    def pump(self) -> None:
        """Let Playwright deliver the frames seen so far: its sync API runs event handlers only inside one of its
        calls, so a poll of ``events`` alone would never see a new one."""
        try:
            self.page.evaluate("() => 0")
        except Exception:  # noqa: BLE001 - a navigation under way: the next poll pumps again
            pass

    def _socket(self, ws) -> None:
        if "_stcore/stream" in ws.url:
            ws.on("framesent", self._sent)
            ws.on("framereceived", self._received)

    def _sent(self, payload) -> None:
        from streamlit.proto.BackMsg_pb2 import BackMsg
        if isinstance(payload, str):
            return
        msg = BackMsg()
        msg.ParseFromString(payload)
        # the frontend's own timed reruns of a fragment (run_every) are nobody's input
        if msg.WhichOneof("type") == "rerun_script" and not msg.rerun_script.is_auto_rerun:
            self.events.append(("sent", msg.rerun_script.fragment_id))

    def _received(self, payload) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
        if isinstance(payload, str):
            return
        msg = ForwardMsg()
        msg.ParseFromString(payload)
        if msg.WhichOneof("type") == "script_finished":
            self.events.append(("finished", msg.script_finished))

    def first(self, kind: str, after: int):
        """Index of the first event of ``kind`` at or after ``after``, or None (frames seen so far pumped in)."""
        self.pump()
        return next((i for i in range(after, len(self.events)) if self.events[i][0] == kind), None)

    def ended(self, sent: int) -> bool:
        """Whether the run asked for at event ``sent`` has finished: a whole-script run ends with a finish that is
        not "early for a rerun" (another request cut it short and its run ends later), a fragment run with the
        fragment's finish."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
        self.pump()
        fragment = bool(self.events[sent][1])
        wanted = ({ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY} if fragment else
                  {ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_WITH_COMPILE_ERROR})
        return any(kind == "finished" and status in wanted for kind, status in self.events[sent + 1:])


_RERUNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def watched_page(browser, **options):
    """A new page of ``browser`` (``options`` as for ``new_page``) whose reruns :func:`rerun_of` can wait for."""
    page = browser.new_page(**options)
    page.set_default_timeout(UI_MS)
    _RERUNS[page] = Reruns(page)
    return page


@contextlib.contextmanager
def rerun_of(page, start: float = 5.0):
    """``with rerun_of(page): <an input>``: afterwards the rerun the input caused has ended and the page is idle.
    An input that causes no rerun (a value typed again) waits ``start`` seconds for one. On a page not made by
    :func:`watched_page` the page's running mark is watched instead (a quick rerun may end before it looks)."""
    reruns = _RERUNS.get(page)
    mark = len(reruns.events) if reruns else 0
    yield
    if reruns is None:
        try:
            wait_until(lambda: not app_idle(page), start, "the rerun to start", interval=0.05)
        except AssertionError:
            pass
    else:
        try:
            sent = wait_until(lambda: (i := reruns.first("sent", mark)) is not None and (i,), start,
                              "the rerun to be asked for", interval=0.05)[0]  # (index 0 is an answer too)
        except AssertionError:
            sent = None
        if sent is not None:
            wait_until(lambda: reruns.ended(sent) or None, UI, "the rerun to finish", interval=0.05)
    wait_until(lambda: app_idle(page), UI, "the rerun to end", interval=0.05)


def edit_grid_cell(page, grid, row: int, column: int, value: str) -> None:
    """Type ``value`` into cell (row, column) of a data editor's canvas ``grid`` and commit it (Enter), then wait
    for the rerun it causes to end. Rows are 35 px under a 35 px header; the cell is reached from the row's first
    column with the arrow keys, and opened with Enter. The grid's hidden accessibility table (cells
    ``glide-cell-{column}-{row}``, the selected one ``aria-selected``) says where the keys got to, once drawn.

    A click or key that lands while a rerun redraws the grid is lost: the selection stops short of the cell, or
    nothing opens, or a read-only cell's disabled editor opens. Then the editor is closed and the cell reached
    again. A click on the cell that is already selected opens that cell's editor instead of selecting it (the
    grid's second-click activation): a start cell left selected by a failed try is left first (a click on the
    row's last cell), else its read-only editor took every later key and each try failed alike (CI, 240 s)."""
    editor = page.locator("#portal .gdg-input")
    start = grid.locator(f'[data-testid="glide-cell-0-{row}"]')
    deadline = time.time() + UI
    tries = []  # what each failed try found, for the message

    def selected() -> list[str]:
        return grid.locator('td[aria-selected="true"]').evaluate_all("cells => cells.map(c => c.id)")

    def close_editor():
        page.keyboard.press("Escape")
        try:
            editor.wait_for(state="detached", timeout=5000)
        except Exception:  # the key did not reach the editor: a click outside the grid closes it
            page.mouse.click(5, 5)  # the page's top-left corner: no widget there
            editor.wait_for(state="detached")

    while True:
        assert time.time() < deadline, f"the editor of cell ({row}, {column}) did not open: {tries}"
        if editor.count():
            close_editor()
        grid.scroll_into_view_if_needed()
        box = grid.bounding_box()
        y = box["y"] + 35 * (row + 1) + 17
        if start.count() == 1 and start.get_attribute("aria-selected") == "true":
            page.mouse.click(box["x"] + box["width"] - 10, y)  # another cell of the row first (not selected)
        page.mouse.click(box["x"] + 10, y)
        for _ in range(column):
            page.keyboard.press("ArrowRight")
        if start.count() == 1:  # the accessibility table is drawn (it follows the selection a moment later)
            target = [f"glide-cell-{column}-{row}"]
            try:
                wait_until(lambda: selected() == target, 3, "the selection", interval=0.05)
            except AssertionError:
                tries.append(f"the keys reached {selected()}")
                continue
        page.keyboard.press("Enter")
        try:
            editor.wait_for(timeout=5000)
        except Exception:
            tries.append("nothing opened")
            continue
        if editor.is_enabled():
            break
        tries.append(f"a read-only cell opened, showing {editor.input_value()!r}")
    editor.fill(value)
    with rerun_of(page, start=10):
        editor.press("Enter")
        editor.wait_for(state="detached")


def test_successive_tier_edits_all_count(server, browser):
    """Three edits of the Train page's tier table in a row each count, and ?tiers= carries them all: the table
    starts from the URL once, so the URL the page writes after one edit never remounts the table under the next
    one (which dropped every second edit)."""
    import json
    import urllib.parse

    def new_tier(page) -> list[int]:
        """The classes of the tier without a preset name (the one the edits made), from the URL."""
        query = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)
        tiers = json.loads(query["tiers"][0])["tiers"] if "tiers" in query else []
        return sorted(c for t in tiers if not t["name"] for c in t["classes"])

    page = watched_page(browser, viewport={"width": 1440, "height": 1300})
    page.goto(server[0] + "train?dataset=digits&preset=paper")
    page.get_by_role("button", name="Got it").click()
    page.locator(".st-key-intro-box").wait_for(state="detached")
    grid = page.locator('.st-key-tier-editor-digits-paper [data-testid="data-grid-canvas"]')
    grid.wait_for()
    wait_until(lambda: app_idle(page), UI, "the page to settle")
    for row in (0, 1, 4):  # classes 0, 1 and 4 (tier 3 of the paper split) move to a new tier 4, one by one
        edit_grid_cell(page, grid, row, column=2, value="4")  # columns: class, name, tier, ε
    # one more rerun (Seed + 1): Streamlit 1.67 shows a rerun's ?tiers= in the address bar only after the next one
    page.locator(".st-key-seed [data-testid='stNumberInputStepUp']").click()
    try:
        wait_until(lambda: "seed=1" in page.url and new_tier(page) == [0, 1, 4], UI, "all three edits in the URL")
    except AssertionError:
        page.screenshot(path=str(server[2] / "tier_edits.png"))
        raise AssertionError(f"the new tier holds {new_tier(page)}, not [0, 1, 4] (screenshot: "
                             f"{server[2] / 'tier_edits.png'}); URL {page.url}") from None
    page.close()


def test_the_pages_fetch_nothing_beyond_the_lab_server_and_the_favicon_ships(server, browser):
    """Offline on a fresh machine: every request of the first page load goes to the lab's own server (the
    favicon too: it ships in assets/, a material-icon favicon was fetched from the internet)."""
    url, _, _ = server
    page = browser.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto(url + "audit")
        wait_until(lambda: page.locator("h1").count() > 0 and app_idle(page), UI, "the audit page")
        icon = page.evaluate("() => (document.querySelector(\"link[rel~='icon']\") || {}).href || ''")
        wait_until(lambda: any("favicon" in r or r == icon for r in requests) or icon.startswith(url),
                   UI, "the favicon request")
    finally:
        page.close()
    outside = [r for r in requests if not r.startswith(url[:-1]) and not r.startswith("data:")
               and not r.startswith("blob:")]
    assert icon.startswith(url), icon  # served by the lab (a media URL of the shipped file)
    assert not outside, outside


def test_launch_is_in_view_on_a_first_visit(server, browser):
    """The primary action sits above the fold of a laptop screen on the first visit (the intro box open)."""
    url, _, _ = server
    context = browser.new_context(viewport={"width": 1280, "height": 800})  # a fresh visitor: no dismissed intro
    page = context.new_page()
    try:
        page.goto(url + "train")
        button = page.locator(".st-key-launch button")
        wait_until(lambda: button.count() == 1 and app_idle(page), UI, "the Launch button")
        box = button.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 800, box
        assert button.is_enabled()  # the default comparison is valid
    finally:
        context.close()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_terminated_or_killed_pytest_leaves_no_server_behind(tmp_path, how):
    """pytest ended from outside while a browser module's server is up: SIGTERM ends it as Ctrl-C does (the
    fixtures' teardown stops the server, its standbys and Chromium); after kill -9, where nothing of pytest
    runs, the server still ends with it (it is in a session of its own, so only the parent-death signal reaches
    it) and its standbys with the server. Before, every such server ran on."""
    import psutil

    # its temporary folders (a kill -9 leaves them behind), removed by this test; short: Chromium's socket paths
    # must stay under 107 characters, which a folder inside tmp_path can pass
    scratch = tempfile.mkdtemp(prefix="lab-inner-")
    with open(tmp_path / "inner.log", "wb") as log:
        inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                                  str(tmp_path / "inner"), "tests/test_browser_forms.py::"
                                  "test_epochs_and_a_tier_epsilon_are_refused_with_one_message_and_launch_disabled"],
                                 cwd=ROOT, env=dict(os.environ, TMPDIR=scratch, PRIVACY_LAB_PREWARM="0"),  # no standbys
                                 stdout=log, stderr=subprocess.STDOUT)

    def family() -> dict:
        """The inner pytest's descendants now: process → its command line."""
        out = {}
        try:
            for p in psutil.Process(inner.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    out[p] = " ".join(p.cmdline())
        except psutil.Error:
            pass
        return out

    def both_up():  # the server up and healthy: the module's Chromium starts after it
        f = family()
        if any("streamlit run" in c for c in f.values()) and any("chrom" in c for c in f.values()):
            return f
        assert inner.poll() is None, ("the inner pytest ended first", (tmp_path / "inner.log").read_text()[-2000:])
        return None

    try:
        started = wait_until(both_up, UI, "the inner pytest's Streamlit server and Chromium")
        os.kill(inner.pid, getattr(signal, how))
        inner.wait(UI)
        wait_until(lambda: not any(pid_alive(p.pid, since=p.create_time()) for p in started), UI,
                   f"every process the inner pytest started to end after its {how}")
        assert any("streamlit run" in c for c in started.values())
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
        shutil.rmtree(scratch, ignore_errors=True)
