"""The CLI in the test's own process: :func:`engine.cli.main` (or an experiment script's ``main``) on an argv,
seen as a subprocess would show it.

A ``python -m engine`` subprocess spends ~6 s importing torch, Opacus, SciPy and pandas before it reads its
first argument; a test of a dozen CLI calls paid a minute for that alone. :func:`cli_here` calls ``main`` here
and returns what ``subprocess.run(..., capture_output=True, text=True)`` would: the exit code (argparse's
``SystemExit`` included), stdout and stderr, and an unexpected exception's traceback on stderr with exit 1
(so a "no traceback" assertion still fails when the CLI would have crashed).

What it cannot show stays with subprocess tests: signals and kill -9 of a run, a per-process file-size limit, the
installed console command, the app server, and warnings (pytest captures them here).
Whatever a call changes in the process (``--data-dir`` sets ``$PRIVACY_LAB_DATA_DIR``, a run sets torch's
thread count, the working directory) is put back after it.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import traceback
from pathlib import Path

import torch

from engine.cli import main


def cli_here(*args, store=None, env: dict | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``privacy-lab [--store STORE] *args`` in this process. ``env``: variables set for the call (None unsets)."""
    argv = [*(["--store", str(store)] if store is not None else []), *map(str, args)]
    return main_here(main, argv, env=env, cwd=cwd)


def main_here(entry, argv: list[str], *, env: dict | None = None, cwd: str | Path | None = None
              ) -> subprocess.CompletedProcess:
    """``entry(argv)`` (a command line's ``main``: returns or raises SystemExit with its exit code) in this process,
    as :func:`subprocess.run` with ``capture_output=True, text=True`` would report it."""
    argv = [str(a) for a in argv]
    saved_env, saved_cwd, saved_threads = dict(os.environ), os.getcwd(), torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    try:
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = entry(argv)
            except SystemExit as e:  # argparse's usage errors and --help; a script's sys.exit(message)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=err)
            except Exception:  # noqa: BLE001 - what the interpreter would print for an uncaught error
                traceback.print_exc(file=err)
                code = 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(saved_threads)
    return subprocess.CompletedProcess(argv, code or 0, out.getvalue(), err.getvalue())
