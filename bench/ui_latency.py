"""UI latency of the live view, with three algorithms (IDP-SGD, INO-SGD, DP-SGD-S): click "Launch comparison"
→ the first live point in the browser, and the interval between successive visible updates of the live MID
chart (read from the page's plotted data, Plotly's calcdata) while a run is training.

Starts ``streamlit run app.py`` on a free local port with a temporary run store, drives Debian's Chromium
(headless) with Playwright. ``--loaded`` repeats the measurement with one extra CPU-bound process running
(``python -c "while True: pass"``, ended with the bench: also on a timeout, SIGTERM or the bench's death).

    python bench/ui_latency.py                  # quiet machine, human-readable
    python bench/ui_latency.py --loaded --json  # one JSON line: quiet keys, and the same under "loaded"

Two more interactions per phase (issue 59), each try on a fresh comparison while its runs train:

* Cancel: click a training run's Cancel → the page says so ("cancelling…", or already "cancelled"), click → the
  page says "cancelled", and the steps its worker trained after the click (the row: "cancelled by the user at step
  N (its worker stopped at step M)", M − N) and the steps still counted after it (its stored steps past N: 0);
* Results: click "Results" in the navigation while the comparison's other runs train → its first chart drawn
  (the MID chart's SVG).

Targets: first point < 3 s quiet / < 6 s loaded; refresh interval ≤ 1.5 s quiet / ≤ 3 s loaded (the page
polls the store every ``app_pages/_status.LIVE_INTERVAL`` seconds). Each try waits for its comparison to end,
so every try starts from an idle lab (warm standby worker, as a user would find it). The runs are long
enough (10–20 s each, evaluations every ~0.5 s) for a few dozen refreshes per phase, so the interval
measures the page, not how often the runs evaluate.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ALGOS = ("idp_sample", "ino", "dpsgd_s")
TARGETS = {"quiet": {"first_point_seconds": 3.0, "refresh_seconds": 1.5, "cancel_said_seconds": 1.0,
                     "cancelled_seconds": 2.0, "steps_counted_after_click": 0, "results_first_chart_seconds": 3.0},
           "loaded": {"first_point_seconds": 6.0, "refresh_seconds": 3.0, "cancel_said_seconds": 1.0,
                      "cancelled_seconds": 2.0, "steps_counted_after_click": 0, "results_first_chart_seconds": 3.0}}
# the live status rows' text, and whether the Results page's first chart (the MID chart) is drawn
STATUS_TEXT = "() => { const c = document.querySelector('.st-key-live-status'); return c ? c.innerText : ''; }"
RESULTS_DRAWN = "() => !!document.querySelector('.st-key-chart-res-mid svg.main-svg')"
# the live MID chart's plotted data: [points drawn, largest x drawn, the chart's text] (a long curve is drawn
# thinned to a fixed number of points, so a refresh can move its end without changing the count)
PLOTTED = """() => { const c = document.querySelector('.st-key-chart-live-mid');
    const gd = c && c.querySelector('.js-plotly-plot');
    if (!gd || !gd.calcdata) return [0, -1, ''];
    let n = 0, m = -1;
    for (const cd of gd.calcdata) for (const p of cd) if (p.x !== undefined) { n++; if (p.x > m) m = p.x; }
    return [n, m, c.innerText]; }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # child side of Popen: SIGKILL when the bench dies (Linux)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def start_app(store: str, port: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PRIVACY_LAB_STORE=store, PYTHONPATH=str(ROOT))
    log = open(log_path, "wb")
    return subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def start_burner() -> subprocess.Popen:
    """One extra CPU-bound process (the "loaded" machine)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_parent)


def stop(proc: subprocess.Popen | None, wait: float = 10) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(wait)


def wait_http(port: int, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the Streamlit app did not start")


def _store(path: str):
    sys.path.insert(0, str(ROOT))
    from engine.store.db import RunStore

    return RunStore(path)


def wait_idle(store, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not [r for r in store.list_runs() if r["status"] in ("queued", "running")]:
            return
        time.sleep(0.2)
    raise RuntimeError("runs did not finish")


def measure(page, store, *, timeout: float = 300) -> tuple[float, list[float], list[float]]:
    """One try: (seconds from the click to the new comparison's first point, refresh intervals in seconds).

    A refresh interval is the time between two successive changes of the chart's plotted data while the
    same runs of the comparison are training (running, past their first step) at both ends; two train side
    by side on 2 cores. An interval in which a run ended or started (a hand-over: the last point of one →
    the first of the next, which includes the next worker's start) is not a refresh: it is returned
    separately, as the third element (seconds, one per hand-over)."""
    runs = store.list_runs()
    first = (max(r["id"] for r in runs) if runs else 0) + 1
    launch = page.get_by_role("button", name="Launch comparison")
    launch.wait_for(state="visible", timeout=120_000)
    page.wait_for_function("b => !b.disabled", arg=launch.element_handle(), timeout=120_000)
    t0 = time.perf_counter()
    launch.click()
    deadline = time.time() + timeout
    first_point, last, changes = None, None, []  # changes: (time, ids of the runs training then)
    while time.time() < deadline:
        n, end, text = page.evaluate(PLOTTED)
        now = time.perf_counter()
        mine = [r for r in store.list_runs() if r["id"] >= first]
        # the runs training then: running and past their first step (a run still starting is a hand-over)
        training = tuple(sorted(r["id"] for r in mine if r["status"] == "running" and (r["step"] or 0) > 0))
        if first_point is None:
            if n and f"#{first}" in text:
                first_point, last = now - t0, (n, end)
                changes.append((now, training))
        elif (n, end) != last:
            last = (n, end)
            changes.append((now, training))
        if len(mine) == len(ALGOS) and all(r["status"] not in ("queued", "running") for r in mine):
            break
        if time.perf_counter() - t0 > 60 and sorted(r["algorithm"] for r in mine) != sorted(ALGOS):
            raise RuntimeError(f"the launch did not queue {ALGOS}: {[r['algorithm'] for r in mine]}")
        time.sleep(0.02)
    if first_point is None:
        raise RuntimeError("no live point appeared")
    pairs = list(zip(changes, changes[1:]))
    intervals = [b[0] - a[0] for a, b in pairs if a[1] and a[1] == b[1]]
    handovers = [b[0] - a[0] for a, b in pairs if a[1] != b[1]]
    return first_point, intervals, handovers


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _poll(page, js: str, pred, timeout: float = 120.0, every: float = 0.02):
    """Evaluate ``js`` on the page until ``pred(value)``; (seconds since the call, value)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        value = page.evaluate(js)
        if pred(value):
            return time.perf_counter() - t0, value
        time.sleep(every)
    raise RuntimeError(f"timed out waiting on {js[:60]}")


def _stages(page):  # (a diagnostic: BENCH_STAGES=1 prints when each stage of the Results page showed)
    t0, seen = time.perf_counter(), {}
    stages = {"title": "!!Array.from(document.querySelectorAll('h1')).find(h => h.innerText.includes('Results'))",
              "headline": "!!document.querySelector('.st-key-headline')",
              "mid-container": "!!document.querySelector('.st-key-chart-res-mid')",
              "mid-plot": "!!document.querySelector('.st-key-chart-res-mid .js-plotly-plot')",
              "mid-svg": "!!document.querySelector('.st-key-chart-res-mid svg.main-svg')",
              "export": "!!document.querySelector('.st-key-pack-build')"}
    while len(seen) < len(stages) and time.perf_counter() - t0 < 60:
        for k, js in stages.items():
            if k not in seen and page.evaluate("() => " + js):
                seen[k] = round(time.perf_counter() - t0, 2)
        time.sleep(0.02)
    print("stages", seen, file=sys.stderr)
    return seen.get("mid-svg", 60.0), None


def cancel_and_results(page, store, url: str, *, timeout: float = 300) -> dict:
    """One try of the Cancel and the Results interactions (module doc) on a fresh comparison."""
    import re

    page.goto(url, wait_until="domcontentloaded")
    runs = store.list_runs()
    first = (max(r["id"] for r in runs) if runs else 0) + 1
    launch = page.get_by_role("button", name="Launch comparison")
    launch.wait_for(state="visible", timeout=120_000)
    page.wait_for_function("b => !b.disabled", arg=launch.element_handle(), timeout=120_000)
    launch.click()
    deadline = time.time() + timeout
    while time.time() < deadline:  # the first run trains (a quarter of its steps), shown on the page
        run = store.get_run(first)
        if run and run["status"] == "running" and run["total_steps"] and run["step"] > run["total_steps"] // 4:
            break
        time.sleep(0.05)
    button = page.locator(f".st-key-cancel-{first} button")
    button.wait_for(state="visible", timeout=60_000)
    t0 = time.perf_counter()
    button.click()
    said = None
    while time.perf_counter() - t0 < 120:
        text = page.evaluate(STATUS_TEXT)
        now = time.perf_counter() - t0
        if said is None and ("cancelling" in text or "cancelled" in text):
            said = now
        if re.search(r"\bcancelled\b", text) and store.get_run(first)["status"] == "cancelled":
            break
        time.sleep(0.02)
    else:
        raise RuntimeError("the run was never shown cancelled")
    cancelled = now
    end = time.time() + 10  # the manager's finish: the row names the click's step (and the worker's)
    while not (store.get_run(first)["error"] or "").startswith("cancelled by the user") and time.time() < end:
        time.sleep(0.05)
    run = store.get_run(first)
    m = re.search(r"at step (\d+)(?: \(its worker stopped at step (\d+)\))?", run["error"] or "")
    click_step = int(m.group(1)) if m else None
    worker_step = int(m.group(2)) if m and m.group(2) else click_step
    stored = max((s["step"] for s in store.step_metrics(first)), default=0)
    # Results while the comparison's other runs train
    assert any(r["status"] == "running" for r in store.list_runs() if r["id"] > first), "nothing trains any more"
    link = page.get_by_role("link", name="Results")
    link.click()
    results, _ = _poll(page, RESULTS_DRAWN, bool) if not os.environ.get("BENCH_STAGES") else _stages(page)
    training = sum(r["status"] == "running" for r in store.list_runs())
    return {"cancel_said": said, "cancelled": cancelled, "click_step": click_step,
            "trained_after_click": None if click_step is None else worker_step - click_step,
            "counted_after_click": None if click_step is None else max(0, stored - click_step),
            "results": results, "results_runs_training": training, "error": run["error"]}


def phase(page, store, tries: int, settle: float, url: str | None = None) -> dict:
    firsts, intervals, handovers = [], [], []
    for _ in range(tries):
        time.sleep(settle)  # (a bench, not a test: let the standby worker warm up as it would for a user)
        f, iv, ho = measure(page, store)
        firsts.append(f)
        intervals += iv
        handovers += ho
        wait_idle(store)
    r = lambda x: None if x is None else round(x, 3)  # noqa: E731
    out = {"first_point_seconds": r(statistics.median(firsts)), "first_point_tries": [r(x) for x in firsts],
           "refresh_p50_seconds": r(percentile(intervals, 0.5)), "refresh_p95_seconds": r(percentile(intervals, 0.95)),
           "refresh_max_seconds": r(max(intervals) if intervals else None), "refresh_samples": len(intervals),
           "handover_max_seconds": r(max(handovers) if handovers else None)}
    if url is None:
        return out
    tries_cr = []
    for _ in range(tries):
        time.sleep(settle)
        tries_cr.append(cancel_and_results(page, store, url))
        wait_idle(store)
    page.goto(url, wait_until="domcontentloaded")  # (back on Train for the next phase: the tries end on Results)
    med = lambda key: statistics.median(t[key] for t in tries_cr if t[key] is not None)  # noqa: E731
    out.update(cancel_said_seconds=r(med("cancel_said")), cancelled_seconds=r(med("cancelled")),
               steps_trained_after_click=[t["trained_after_click"] for t in tries_cr],
               steps_counted_after_click=max(t["counted_after_click"] or 0 for t in tries_cr),
               results_first_chart_seconds=r(med("results")),
               cancel_tries=[{k: (r(v) if isinstance(v, float) else v) for k, v in t.items() }
                             for t in tries_cr])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--loaded", action="store_true", help="also measure with one extra CPU-bound process running")
    p.add_argument("--tries", type=int, default=3, help="comparisons launched per phase")
    p.add_argument("--settle", type=float, default=5.0, help="seconds of idle before each try")
    p.add_argument("--epochs", type=float, default=100.0,
                   help="epochs of each digits run (600 samples, batch 64: ~940 steps, ~25 evaluations)")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    def on_term(signum, frame):  # SIGTERM (e.g. `timeout`): unwind, so the finally blocks end every child
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    tmp = tempfile.mkdtemp(prefix="lab-bench-")
    store_path = str(Path(tmp) / "runs.sqlite")
    port = free_port()
    app = start_app(store_path, port, Path(tmp) / "streamlit.log")
    burner = None
    result: dict = {}
    try:
        wait_http(port)
        store = _store(store_path)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            from urllib.parse import quote

            from engine.config.run import ALGORITHM_LABELS  # the multiselect's URL holds its labels

            query = "&".join([f"epochs={args.epochs}", "dataset=digits", "max_train=600", "batch=64"]
                             + [f"algos={quote(ALGORITHM_LABELS[a])}" for a in ALGOS])
            url = f"http://127.0.0.1:{port}/train?{query}"
            page.goto(url, wait_until="domcontentloaded")
            result = phase(page, store, args.tries, args.settle, url)
            result["load_average_quiet"] = [round(x, 2) for x in os.getloadavg()]
            print(json.dumps({"quiet": result}), file=sys.stderr, flush=True)  # kept if the loaded phase fails
            if args.loaded:
                burner = start_burner()
                result["loaded"] = phase(page, store, args.tries, args.settle, url)
            browser.close()
    finally:
        stop(burner)
        stop(app)
    sys.path.insert(0, str(ROOT))
    from app_pages._status import LIVE_INTERVAL  # noqa: E402 - the page's polling period

    result.update(algorithms=list(ALGOS), live_interval_seconds=LIVE_INTERVAL, targets=TARGETS, cores=os.cpu_count(),
                  load_average=[round(x, 2) for x in os.getloadavg()])
    if args.json:
        print(json.dumps(result))
        return 0
    for name, r in [("quiet", result)] + ([("loaded", result["loaded"])] if "loaded" in result else []):
        t = TARGETS[name]
        print(f"{name}: click → first live point {r['first_point_seconds']:.2f} s (median of "
              f"{', '.join(f'{x:.2f}' for x in r['first_point_tries'])}; target < {t['first_point_seconds']:g} s); "
              f"refresh interval p50 {r['refresh_p50_seconds']} s, p95 {r['refresh_p95_seconds']} s over "
              f"{r['refresh_samples']} refreshes (target ≤ {t['refresh_seconds']:g} s); longest hand-over between "
              f"runs {r['handover_max_seconds']} s")
        print(f"{name}: Cancel → said {r['cancel_said_seconds']} s (target ≤ {t['cancel_said_seconds']:g} s), "
              f"→ cancelled {r['cancelled_seconds']} s (target ≤ {t['cancelled_seconds']:g} s); steps its worker "
              f"trained after the click {r['steps_trained_after_click']}, counted {r['steps_counted_after_click']} "
              f"(target 0); open Results while runs train → first chart {r['results_first_chart_seconds']} s "
              f"(target ≤ {t['results_first_chart_seconds']:g} s)")
    print(f"load average at the end {result['load_average']}, after the quiet phase {result['load_average_quiet']}; "
          f"{result['cores']} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
