"""Data and store faults, each with its exact outcome: one line naming the file (CLI: exit 2, no
traceback), nothing already saved changed, decompression bounded. Real SQLite files, real gzip
streams and real PNGs; the full disk is a real small tmpfs where this machine lets us mount one,
else a real per-process file-size limit (RLIMIT_FSIZE)."""
from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import pytest
from in_process import cli_here

from conftest import wait_until
from engine.data import DataError, files, load_dataset
from engine.store.db import RunStore
from engine.store.errors import StoreError

try:  # tests/ as a package or as a plain folder on sys.path
    from . import fixtures_data as fx
except ImportError:  # pragma: no cover
    import fixtures_data as fx

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PRIVACY_LAB_OFFLINE="1", OMP_NUM_THREADS="1")


def cli_process(*args, store, timeout=300, **kw):
    """``python -m engine`` as a user runs it (for what only a process shows: a file-size limit, kill -9)."""
    return subprocess.run([sys.executable, "-m", "engine", "--store", str(store), *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout, **kw)


def cli(*args, store):
    """The same command in this process (tests/in_process.py), downloads off as in ``ENV``."""
    return cli_here(*args, store=store, env={"PRIVACY_LAB_OFFLINE": "1"})


def one_line_error(out, *, naming) -> str:
    """exit 2, exactly one stderr line starting with 'error:' that names ``naming``, no traceback."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and str(naming) in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def finished_store(tmp_path_factory) -> Path:
    """A store holding one finished run, checkpointed into the main file (no -wal)."""
    d = tmp_path_factory.mktemp("finished")
    cfg = d / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1}))
    out = cli("run", str(cfg), "--json", store=d / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(d / "runs.sqlite") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return d / "runs.sqlite"


def snapshot(path: Path) -> tuple:
    """A finished run as stored: its row, its step and eval metrics."""
    s = RunStore(path, readonly=True)
    return s.get_run(1), s.step_metrics(1), s.eval_metrics(1)


# ------------------------------------------------------------------------------------- stores
def _damage(kind: str, good: bytes) -> bytes:
    if kind == "corrupt":
        return os.urandom(100) + good[100:]
    if kind == "truncated":
        return good[: len(good) // 3]
    return bytes(len(good))  # zeroed


@pytest.mark.parametrize("kind", ["corrupt", "truncated", "zeroed"])
@pytest.mark.parametrize("cmd", [["list"], ["show", "1"], ["run"]])
def test_damaged_store_is_one_line_and_untouched(tmp_path, finished_store, kind, cmd):
    path = tmp_path / "runs.sqlite"
    path.write_bytes(_damage(kind, finished_store.read_bytes()))
    before = path.read_bytes()
    if cmd == ["run"]:
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1}))
        cmd = ["run", str(cfg)]
    line = one_line_error(cli(*cmd, store=path), naming=path)
    assert "damaged" in line and "move it aside" in line
    assert path.read_bytes() == before
    with pytest.raises(StoreError, match="damaged"):  # the same one line for the UI
        RunStore(path, readonly=True).list_runs()


@pytest.mark.parametrize("cmd", [["list"], ["show", "1"]])
def test_directory_in_place_of_the_store(tmp_path, cmd):
    path = tmp_path / "runs.sqlite"
    path.mkdir()
    line = one_line_error(cli(*cmd, store=path), naming=path)
    assert "is a directory" in line
    assert path.is_dir() and list(path.iterdir()) == []
    # a folder given as the store holding a *directory* named runs.sqlite: the same line
    line = one_line_error(cli(*cmd, store=tmp_path), naming=path)
    assert "is a directory" in line


@pytest.mark.parametrize("cmd, naming", [(["audit", "missing.json"], "missing.json"),
                                         (["audit", "--preset", "quick", "--set", "R=0"], "R"),
                                         (["one-run-audit", "--set", "canaries=-1"], "canaries"),
                                         (["run", "missing.json"], "missing.json"),
                                         (["rerun", "1"], "no run store")])
def test_a_refused_command_creates_no_store(tmp_path, cmd, naming):
    """A command refused before it runs (a missing config file, a bad override) leaves no store file behind."""
    path = tmp_path / "sub" / "runs.sqlite"
    one_line_error(cli(*cmd, store=path), naming=naming)
    assert not path.parent.exists()


@pytest.mark.parametrize("cmd", [["list"], ["show", "1"], ["export", "1"]])
def test_missing_store_is_not_created_by_read_commands(tmp_path, cmd):
    path = tmp_path / "sub" / "runs.sqlite"
    line = one_line_error(cli(*cmd, store=path), naming=path)
    assert "no run store" in line and "`privacy-lab run CONFIG`" in line  # the installed command's name
    assert not path.parent.exists()


def _read_only(path: Path):
    """Make ``path``'s folder read-only for this process; returns an undo callable (None: cannot)."""
    folder = path.parent
    os.chmod(path, 0o444)
    os.chmod(folder, 0o555)

    def undo_chmod():
        os.chmod(folder, 0o755)
        os.chmod(path, 0o644)
    if not os.access(folder, os.W_OK):
        return undo_chmod
    undo_chmod()  # root ignores permissions: a read-only bind mount, where allowed
    ok = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["umount", "-l", str(folder)], check=True)
    if ok:
        subprocess.run(["umount", "-l", str(folder)], check=True)
    return None


def test_read_only_store_lists_and_shows_but_run_says_read_only(tmp_path, finished_store):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "runs.sqlite"
    shutil.copy(finished_store, path)
    before = path.read_bytes()
    undo = _read_only(path)
    if undo is None:
        pytest.skip("cannot make a folder read-only here (root without mount)")
    try:
        listed = cli("list", "--json", store=path)
        assert listed.returncode == 0, listed.stderr
        assert [(r["id"], r["status"]) for r in json.loads(listed.stdout)] == [(1, "finished")]
        shown = cli("show", "1", store=path)
        assert shown.returncode == 0 and "[finished]" in shown.stdout and "ε=1" in shown.stdout
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1}))
        line = one_line_error(cli("run", str(cfg), store=path), naming=path)
        assert "read-only" in line
        assert path.read_bytes() == before
        assert sorted(p.name for p in folder.iterdir()) == ["runs.sqlite"]  # no -wal, -shm, -reserve
    finally:
        undo()


def test_foreign_sqlite_file_is_not_turned_into_a_store(tmp_path):
    path = tmp_path / "notes.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
        db.execute("INSERT INTO notes VALUES ('keep me')")
    db.close()
    before = path.read_bytes()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 1}))
    for cmd in (["list"], ["run", str(cfg)]):
        line = one_line_error(cli(*cmd, store=path), naming=path)
        assert "not a run store" in line
    assert path.read_bytes() == before


def test_debug_flag_adds_the_traceback(tmp_path):
    path = tmp_path / "runs.sqlite"
    path.write_bytes(bytes(8192))
    plain = cli("list", store=path)
    one_line_error(plain, naming=path)
    debug = cli("--debug", "list", store=path)
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()


def test_os_error_is_one_line_through_the_last_resort_handler(tmp_path, finished_store):
    path = tmp_path / "runs.sqlite"
    shutil.copy(finished_store, path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = one_line_error(cli("export", "1", "--format", "csv", "--out", str(blocker / "figures"), store=path),
                          naming=blocker / "figures")
    assert line.startswith("error: NotADirectoryError:") and line.endswith("(run again with --debug for the traceback)")
    assert blocker.read_text() == "not a folder"


def test_failed_run_before_start_leaves_the_finished_run_intact(tmp_path, finished_store):
    path = tmp_path / "runs.sqlite"
    shutil.copy(finished_store, path)
    before = snapshot(path)
    cfg = tmp_path / "credit.json"  # not in this data folder, not shipped, downloads off: a DataError
    cfg.write_text(json.dumps({"data": {"name": "credit_default", "data_dir": str(tmp_path / "nodata")},
                               "model": {"name": "lr"}, "epochs": 1}))
    line = one_line_error(cli("run", str(cfg), store=path), naming="default_of_credit_card_clients.csv.gz")
    assert str(tmp_path / "nodata" / "credit_default") in line
    assert not (tmp_path / "nodata").exists()  # no data folder made for a download that never happened
    assert snapshot(path) == before
    assert [r["id"] for r in RunStore(path, readonly=True).list_runs()] == [1]  # nothing written


@pytest.mark.slow
def test_kill_9_of_engine_run_shows_interrupted(tmp_path, finished_store):
    path = tmp_path / "runs.sqlite"
    shutil.copy(finished_store, path)
    before = snapshot(path)
    cfg = tmp_path / "long.json"
    cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 400, "eval_every": 5}))
    proc = subprocess.Popen([sys.executable, "-m", "engine", "--store", str(path), "run", str(cfg)], cwd=REPO,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len(RunStore(path, readonly=True).eval_metrics(2)) >= 2, 180, "run 2 to log evaluations")
        assert RunStore(path, readonly=True).get_run(2)["status"] == "running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    listed = cli("list", "--json", store=path)
    assert listed.returncode == 0, listed.stderr
    assert {r["id"]: r["status"] for r in json.loads(listed.stdout)} == {1: "finished", 2: "interrupted"}
    shown = json.loads(cli("show", "2", "--json", store=path).stdout)
    assert shown["status"] == "interrupted" and str(proc.pid) in shown["error"]
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:  # list/show only showed it: nothing written
        assert db.execute("SELECT status FROM runs WHERE id=2").fetchone()[0] == "running"
    assert RunStore(path).mark_dead_runs() == [2]  # the next writer records it
    assert RunStore(path, readonly=True).get_run(2)["status"] == "interrupted"
    assert snapshot(path) == before


def test_reused_pid_does_not_keep_a_dead_run_running(tmp_path, finished_store):
    """A run 'running' under a pid that now belongs to a younger process (this test's own) is dead."""
    path = tmp_path / "runs.sqlite"
    shutil.copy(finished_store, path)
    store = RunStore(path)
    old, fresh = store.create_run({"name": "old"}), store.create_run({"name": "fresh"})
    for rid in (old, fresh):
        store.start_run(rid, pid=os.getpid(), total_steps=10)
    with sqlite3.connect(path) as db:  # the old run started a day before this process did
        db.execute("UPDATE runs SET started_at=started_at-86400 WHERE id=?", (old,))
    db.close()
    shown = {r["id"]: r["status"] for r in RunStore(path, readonly=True).list_runs()}
    assert shown == {1: "finished", old: "interrupted", fresh: "running"}
    assert store.mark_dead_runs() == [old]
    assert store.get_run(fresh)["status"] == "running" and store.get_run(1)["status"] == "finished"


def _mount_tmpfs(folder: Path, size: str) -> bool:
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def test_full_disk_keeps_the_original_error(tmp_path, finished_store):
    folder = tmp_path / "disk"
    folder.mkdir()
    tmpfs = _mount_tmpfs(folder, "256k")
    path = folder / "runs.sqlite"
    try:
        shutil.copy(finished_store, path)
        before = snapshot(path)
        cfg = tmp_path / "big.json"  # one evaluation per step: the store grows until the disk is full
        cfg.write_text(json.dumps({"model": {"name": "lr"}, "epochs": 200, "eval_every": 1}))
        if tmpfs:
            out = cli("run", str(cfg), "--json", store=path)
        else:  # a real limit on the size of any file this process writes (no root needed)
            limit = path.stat().st_size + (96 << 10)

            def small_disk():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            out = cli_process("run", str(cfg), "--json", store=path, preexec_fn=small_disk)
        line = one_line_error(out, naming=path)
        assert "disk is full" in line or "disk I/O error" in line
        for p in folder.iterdir():  # read a copy: the full disk has no room for a reader's -shm
            shutil.copy(p, tmp_path / p.name)
    finally:
        if tmpfs:
            subprocess.run(["umount", "-l", str(folder)], check=True)
    copy = tmp_path / "runs.sqlite"
    assert snapshot(copy) == before
    run = RunStore(copy, readonly=True).get_run(2)
    if tmpfs:  # the reserve beside the store made room: the run is recorded failed with the original error
        assert run["status"] == "failed" and run["error"] == line[len("error: "):]
    else:
        assert run["status"] in ("failed", "interrupted")


# ------------------------------------------------------------------------------------- data
def gzip_bomb(path: Path, mib: int, *, stated_size: int | None = None) -> Path:
    """A real gzip stream of ``mib`` MiB of zeros (about 1000x smaller); optionally with a forged
    ISIZE trailer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(c.compress(zeros))
        f.write(c.flush())
    if stated_size is not None:
        data = bytearray(path.read_bytes())
        data[-4:] = (stated_size % (1 << 32)).to_bytes(4, "little")
        path.write_bytes(bytes(data))
    return path


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.slow
def test_gzip_bomb_refused_on_its_checksum_before_decompressing(tmp_path):
    bomb = gzip_bomb(tmp_path / "german_credit" / "german.data.gz", 256)
    with pytest.raises(DataError) as e:
        load_dataset("german_credit", data_dir=str(tmp_path))
    msg = str(e.value)
    assert msg.startswith(f"Checksum mismatch for {bomb}") and f"{256 << 20} bytes" in msg
    assert "not decompressed" in msg
    kf = files.KNOWN_FILES["german_credit/german.data.gz"]
    peak = _peak_bytes(lambda: pytest.raises(DataError, files.read_verified, bomb, kf))
    assert peak < 8 * bomb.stat().st_size  # the stored bytes only, never the 256 MiB


@pytest.mark.slow
def test_checksummed_but_oversized_stream_refused_by_the_cap(tmp_path):
    bomb = gzip_bomb(tmp_path / "bomb.gz", 256)
    pinned = files.KnownFile("bomb.gz", hashlib.sha256(bomb.read_bytes()).hexdigest(), raw_size=79793)
    with pytest.raises(DataError, match="decompresses to more than 79793 bytes"):
        files.read_verified(bomb, pinned)
    peak = _peak_bytes(lambda: pytest.raises(DataError, files.read_verified, bomb, pinned))
    assert peak < (8 << 20)
    # a forged trailer claiming the original's size is decompressed, and stopped by the same cap
    forged = gzip_bomb(tmp_path / "german_credit" / "german.data.gz", 64, stated_size=79793)
    with pytest.raises(DataError, match=f"{forged} decompresses to more than 79793 bytes"):
        load_dataset("german_credit", data_dir=str(tmp_path))


def _png(path: Path, width: int, height: int) -> Path:
    """A real 1-bit PNG (all black) of width x height: tiny on disk, huge when decoded."""
    from PIL import Image

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")
    row = bytes(1 + (width + 7) // 8)
    c = zlib.compressobj(9)
    idat = b"".join(c.compress(row) for _ in range(height)) + c.flush()
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([1, 0, 0, 0, 0])
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    if width * height <= Image.MAX_IMAGE_PIXELS:
        with Image.open(path) as im:  # a valid PNG that Pillow can decode
            im.load()
            assert im.size == (width, height)
    return path


def test_decompression_bomb_pngs_are_counted(tmp_path):
    from PIL import Image

    folder = tmp_path / "utkface"
    made = fx.make_utkface_folder(folder)
    _png(folder / "30_0_1_20170116174525900.jpg", 20000, 20000)  # Pillow refuses it: DecompressionBombError
    with pytest.raises(Image.DecompressionBombError):
        Image.open(folder / "30_0_1_20170116174525900.jpg")
    _png(folder / "31_1_2_20170116174525901.jpg.chip.jpg", 5000, 5000)  # over the lab's own pixel cap
    ds = load_dataset("utkface", data_dir=str(tmp_path))
    assert len(ds.y_train) + len(ds.y_test) == len(made["valid"])
    assert ds.report.count("decompression_bomb") == 2 and ds.meta["n_decompression_bombs"] == 2
    assert str(ds.report) == f"skipped 8 files in {folder}: 5 malformed names, 2 decompression bombs, 1 unreadable file"


def test_malformed_utkface_names_are_counted_and_printed(tmp_path):
    folder = tmp_path / "utkface"
    made = fx.make_utkface_folder(folder)
    ds = load_dataset("utkface", data_dir=str(tmp_path))
    assert ds.report.count("malformed_name") == len(made["malformed"]) == 5
    assert set(made["malformed"]) <= set(ds.report.examples)
    note = f"note: skipped 6 files in {folder}: 5 malformed names, 1 unreadable file"
    cfg = tmp_path / "utk.json"
    cfg.write_text(json.dumps({"data": {"name": "utkface", "data_dir": str(tmp_path)}, "model": {"name": "lr"},
                               "epochs": 1, "batch_size": 4, "tiers": {"assign": "class", "tiers": [
                                   {"epsilon": 1, "classes": [0]}, {"epsilon": 2, "classes": [1]}]}}))
    out = cli("plan", str(cfg), store=tmp_path / "runs.sqlite")
    assert out.returncode == 0, out.stderr
    # the skipped files' one note (the batch of 4 over these few samples is also hinted, on a warning: line)
    assert [line for line in out.stderr.strip().splitlines() if not line.startswith("warning:")] == [note]
    # a folder with nothing usable: one DataError with the same counts
    empty = tmp_path / "bad" / "utkface"
    empty.mkdir(parents=True)
    (empty / "abc.jpg").write_bytes(b"x")
    _png(empty / "30_0_1_20170116174525900.jpg", 20000, 20000)
    with pytest.raises(DataError, match=r"found 0 usable image\(s\).*1 malformed name, 1 decompression bomb"):
        load_dataset("utkface", data_dir=str(tmp_path / "bad"))


def test_download_moves_into_place_only_on_success(tmp_path):
    src = tmp_path / "src" / "german.data"
    src.parent.mkdir()
    src.write_bytes(b"1 2 3\n")
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    dest = tmp_path / "data" / "german_credit" / "german.data"
    with pytest.raises(DataError, match="sha256"):
        files.download_file(src.as_uri(), dest, "0" * 64)
    assert not (tmp_path / "data").exists()  # the data folder is not created by a failed download
    with pytest.raises(OSError):
        files.download_file((tmp_path / "src" / "missing").as_uri(), dest, good)
    assert not (tmp_path / "data").exists()
    assert files.download_file(src.as_uri(), dest, good) == dest
    assert dest.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["german.data"]  # no partial files left
