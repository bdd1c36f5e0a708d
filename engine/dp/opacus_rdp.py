"""Opacus' RDP analysis (``opacus/accountants/analysis/rdp.py``: ``compute_rdp``, ``get_privacy_spent`` and the
per-order terms) and its default orders, without importing the ``opacus`` package.

``import opacus`` — which any ``opacus.*`` import runs first — imports the privacy engine, its optimizers and with
them ``torch.distributed`` and ``scipy.stats``: about 2 s of CPU in every process that plans or accounts (each
training worker, each CLI command, the app server), measured 3.7–3.9 s for ``opacus.accountants.analysis.rdp``
against 1.6 s for torch alone. The analysis file itself needs only numpy and ``scipy.special``, so it is loaded
here from the installed package as a module of its own: Opacus' code, unchanged. Where ``opacus`` is already
imported (or the file cannot be loaded so), the package's own module is used.

``DEFAULT_ALPHAS`` are ``RDPAccountant.DEFAULT_ALPHAS`` (defined in ``opacus/accountants/rdp.py``, which imports the
optimizers); ``tests/test_accountants.py`` checks that they are the same list.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

#: Opacus' default RDP orders, as ``opacus.accountants.rdp.RDPAccountant.DEFAULT_ALPHAS`` lists them (the integer
#: orders as ints), and as floats.
DEFAULT_ALPHAS: list = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
ORDERS: tuple[float, ...] = tuple(float(a) for a in DEFAULT_ALPHAS)

_NAME = "opacus.accountants.analysis.rdp"


def _load():
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    try:
        spec = importlib.util.find_spec("opacus")  # finds the package without running its __init__
        path = Path(spec.origin).parent / "accountants" / "analysis" / "rdp.py"
        own = importlib.util.spec_from_file_location(f"{__name__}._analysis", path)
        module = importlib.util.module_from_spec(own)
        own.loader.exec_module(module)
        return module
    except Exception:  # an Opacus whose file does not load alone: the package's own import
        from opacus.accountants.analysis import rdp

        return rdp


analysis = _load()
