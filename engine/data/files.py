"""Locating, downloading and checksum-verifying data files.

* :func:`data_dir`: explicit argument > ``$PRIVACY_LAB_DATA_DIR`` > ``~/.cache/privacy-imbalance-lab/data``.
* Every known file has a pinned sha256 (:data:`KNOWN_FILES`). A file is verified when first read;
  successful verifications are cached per (path, mtime, size) so later loads stay fast.
  A ``.gz`` file whose bytes differ but whose *decompressed* content has the pinned raw sha256
  (i.e. the same data re-compressed) is accepted, and so is the uncompressed file itself
  (e.g. ``adult.data`` instead of ``adult.data.gz``).
* A missing file with a known direct URL is downloaded (urllib, 10 s socket timeout) and its
  sha256 checked before it is kept. ``PRIVACY_LAB_OFFLINE=1`` disables downloads.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .base import DataError

ENV_VAR = "PRIVACY_LAB_DATA_DIR"
OFFLINE_ENV_VAR = "PRIVACY_LAB_OFFLINE"
DEFAULT_DATA_DIR = Path("~/.cache/privacy-imbalance-lab/data")
REPO_ROOT = Path(__file__).resolve().parents[2]
ASSETS_DIR = REPO_ROOT / "assets"
DOWNLOAD_TIMEOUT_S = 10.0


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """Root data folder: ``explicit`` > env ``PRIVACY_LAB_DATA_DIR`` > ``~/.cache/privacy-imbalance-lab/data``.

    Relative paths are resolved against the current working directory. The folder need not exist.
    """
    if explicit is not None and str(explicit) != "":
        p = Path(explicit)
    elif os.environ.get(ENV_VAR):
        p = Path(os.environ[ENV_VAR])
    else:
        p = DEFAULT_DATA_DIR
    return p.expanduser().resolve()


@dataclass(frozen=True)
class KnownFile:
    name: str  # file name as looked up, e.g. "adult.data.gz"
    sha256: str  # sha256 of the file's bytes as stored
    raw_sha256: str | None = None  # sha256 of the decompressed content (".gz" files only)
    url: str | None = None  # direct download URL (None: manual download only)
    url_is_raw: bool = False  # True: the URL serves the uncompressed content (saved without ".gz")
    info_url: str | None = None  # page to point users at
    md5: str | None = None  # extra check (CIFAR)

    @property
    def raw_name(self) -> str | None:
        if self.raw_sha256 and self.name.endswith(".gz"):
            return self.name[: -len(".gz")]
        return None

    @property
    def where(self) -> str | None:
        return self.url or self.info_url


_UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases"
_MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist"

# key: "<folder>/<name>"; values from /work/shared/data/SHA256SUMS + MANIFEST.md
KNOWN_FILES: dict[str, KnownFile] = {
    "mnist/train-images-idx3-ubyte.gz": KnownFile(
        "train-images-idx3-ubyte.gz",
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        url=f"{_MNIST_URL}/train-images-idx3-ubyte.gz",
    ),
    "mnist/train-labels-idx1-ubyte.gz": KnownFile(
        "train-labels-idx1-ubyte.gz",
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        url=f"{_MNIST_URL}/train-labels-idx1-ubyte.gz",
    ),
    "mnist/t10k-images-idx3-ubyte.gz": KnownFile(
        "t10k-images-idx3-ubyte.gz",
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        url=f"{_MNIST_URL}/t10k-images-idx3-ubyte.gz",
    ),
    "mnist/t10k-labels-idx1-ubyte.gz": KnownFile(
        "t10k-labels-idx1-ubyte.gz",
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        url=f"{_MNIST_URL}/t10k-labels-idx1-ubyte.gz",
    ),
    "adult/adult.data.gz": KnownFile(
        "adult.data.gz",
        "c7a2b4716a97f930123e0baf879188d701e798172631a654fc703d4b082907f3",
        "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
        url=f"{_UCI}/adult/adult.data",
        url_is_raw=True,
        info_url="https://archive.ics.uci.edu/dataset/2/adult",
    ),
    "adult/adult.test.gz": KnownFile(
        "adult.test.gz",
        "8a2c1bffa6e7ce5abfa43881ae5e87c4311ebc2b3cd526c9c40a43f19f06f799",
        "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
        url=f"{_UCI}/adult/adult.test",
        url_is_raw=True,
        info_url="https://archive.ics.uci.edu/dataset/2/adult",
    ),
    "bank_marketing/bank-full.csv.gz": KnownFile(
        "bank-full.csv.gz",
        "a33820520e31d26b498e31003e99eb0e477690b699a38eade375acf3b3004dcd",
        "d1513ec63b385506f7cfce9f2c5caa9fe99e7ba4e8c3fa264b3aaf0f849ed32d",
        info_url="https://archive.ics.uci.edu/dataset/222/bank+marketing (bank.zip inside the archive)",
    ),
    "credit_default/default_of_credit_card_clients.csv.gz": KnownFile(
        "default_of_credit_card_clients.csv.gz",
        "fad968254e68183c43ebbe35adfa588c0e5073a816b811495646f511d79a0472",
        "4edce6da569b2c30788a85fd98a9bafb1a983e8ca1a7aac875dd7ff853cbd0bb",
        info_url=(
            "https://archive.ics.uci.edu/dataset/350/default+of+credit+card+clients "
            "(the .xls exported as a plain-integer CSV with the ID,...,'default payment next month' header)"
        ),
    ),
    "german_credit/german.data.gz": KnownFile(
        "german.data.gz",
        "a4cc977b7fc38d60827f2f881d8377954ece4d7ade5d026e827307bb63395df2",
        "b21f3d81db8071257d5ff1deaeba1fd4303b62712e6fcc9715c7a86202cb5871",
        url=f"{_UCI}/statlog/german/german.data",
        url_is_raw=True,
        info_url="https://archive.ics.uci.edu/dataset/144/statlog+german+credit+data",
    ),
    "law_school/law_data.csv.gz": KnownFile(
        "law_data.csv.gz",
        "b13c2b601ddbfbcb15b9caf2910396a7ddcb61a2028f88ca3dd3431d340e13fb",
        "cbf494af5e0ac317015cf64945a20587c08ec77118e183d3ddb0026719956d88",
        info_url="https://github.com/mkusner/counterfactual-fairness (law_data.csv, Kusner et al. 2017)",
    ),
}

# successful verifications: (path, mtime_ns, size) -> True
_VERIFIED: dict[tuple[str, int, int], bool] = {}
_LOCK = threading.Lock()


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path), st.st_mtime_ns, st.st_size)


def clear_verification_cache() -> None:
    with _LOCK:
        _VERIFIED.clear()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _maybe_gunzip(data: bytes, path: Path) -> bytes:
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise DataError(f"{path} is not a valid gzip file ({e}). Delete it and fetch it again.") from e
    return data


def read_verified(path: Path, kf: KnownFile) -> bytes:
    """Read ``path`` (the stored ``.gz`` or its uncompressed variant), check it against ``kf``
    and return the *decompressed* content. Raises :class:`DataError` on a mismatch."""
    path = Path(path)
    try:
        key = _stat_key(path)
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e}") from e
    raw = _maybe_gunzip(data, path)
    if _VERIFIED.get(key):
        return raw
    ok = sha256_bytes(data) == kf.sha256
    if not ok and kf.raw_sha256:
        ok = sha256_bytes(raw) == kf.raw_sha256
    if not ok:
        raise DataError(
            f"Checksum mismatch for {path}: its sha256 is {sha256_bytes(data)}, expected "
            f"{kf.sha256}" + (f" (or decompressed content {kf.raw_sha256})" if kf.raw_sha256 else "")
            + ". The file is corrupt or a different version; delete it and get the original"
            + (f" from {kf.where}." if kf.where else ".")
        )
    with _LOCK:
        _VERIFIED[key] = True
    return raw


def download_file(url: str, dest: Path, sha256: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Download ``url`` to ``dest`` (via a temporary ``.part`` file), keeping it only when its
    sha256 equals ``sha256``. Raises on any failure. Tests monkeypatch this to forbid network use."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".part{os.getpid()}")
    h = hashlib.sha256()
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "privacy-imbalance-lab"})
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(tmp, "wb") as out:
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise DataError(f"downloaded {url} but its sha256 {h.hexdigest()} != expected {sha256}")
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest


def downloads_enabled() -> bool:
    return os.environ.get(OFFLINE_ENV_VAR, "").strip().lower() not in {"1", "true", "yes", "on"}


def _candidates(kf: KnownFile) -> list[str]:
    return [kf.name] + ([kf.raw_name] if kf.raw_name else [])


def find_file(folder: Path, kf: KnownFile) -> Path | None:
    for n in _candidates(kf):
        p = folder / n
        if p.is_file():
            return p
    return None


def locate_files(
    dataset: str,
    root: Path,
    folder: str,
    files: list[KnownFile],
    fallback_dirs: tuple[Path, ...] = (),
) -> list[Path]:
    """Return paths for ``files`` in ``root/folder`` (or a fallback dir), downloading missing ones
    that have a direct URL. Raises :class:`DataError` listing everything still missing."""
    target = Path(root) / folder
    found: list[Path | None] = []
    for kf in files:
        p = find_file(target, kf)
        for fb in fallback_dirs:
            if p is None:
                p = find_file(Path(fb), kf)
        found.append(p)
    errors: list[str] = []
    if downloads_enabled():
        for i, kf in enumerate(files):
            if found[i] is None and kf.url:
                dest = target / (kf.raw_name if kf.url_is_raw and kf.raw_name else kf.name)
                want = kf.raw_sha256 if kf.url_is_raw else kf.sha256
                try:
                    found[i] = download_file(kf.url, dest, want)
                except Exception as e:  # offline, HTTP error, read-only dir, bad checksum ...
                    errors.append(f"{kf.name}: download failed ({type(e).__name__}: {e})")
    missing = [kf for kf, p in zip(files, found) if p is None]
    if missing:
        lines = [
            f"Dataset '{dataset}' needs file(s) that were not found: "
            + ", ".join(kf.name for kf in missing)
            + f". Put them in {target}/ (the data folder is set by the data_dir argument or "
            f"${ENV_VAR}; default {DEFAULT_DATA_DIR})."
        ]
        for kf in missing:
            if kf.where:
                lines.append(f"{kf.name} can be downloaded from {kf.where}")
        if errors:
            lines.append("Automatic download did not work: " + "; ".join(errors))
        elif not downloads_enabled():
            lines.append(f"(automatic downloads are disabled by ${OFFLINE_ENV_VAR})")
        raise DataError("\n".join(lines))
    return [p for p in found if p is not None]


def dataset_files_present(info, data_dir_arg=None) -> bool:
    """True when every file ``info`` needs is present (no checksum check, no download)."""
    if info.folder is None:
        return True
    root = data_dir(data_dir_arg)
    folder = root / info.folder
    if not info.files:
        return folder.is_dir()
    fallbacks = (ASSETS_DIR / info.folder,) if info.offline else ()
    for name in info.files:
        kf = KNOWN_FILES.get(f"{info.folder}/{name}") or KnownFile(name, "")
        if not any(find_file(d, kf) for d in (folder, *fallbacks)):
            return False
    return True


def fingerprint(info, root: Path) -> tuple:
    """Cheap identity of the files a dataset would read (for in-process cache keys)."""
    if info.folder is None:
        return ()
    folder = Path(root) / info.folder
    dirs = [folder] + ([ASSETS_DIR / info.folder] if info.offline else [])
    out = []
    if not info.files:  # a user folder (utkface): its mtime and those of its direct sub-folders
        try:
            out.append((str(folder), folder.stat().st_mtime_ns))
            out.extend(sorted((str(p), p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_dir()))
        except OSError:
            out.append((str(folder), None))
    for name in info.files:
        kf = KNOWN_FILES.get(f"{info.folder}/{name}") or KnownFile(name, "")
        for d in dirs:
            p = find_file(d, kf)
            if p is not None:
                out.append(_stat_key(p))
                break
        else:
            out.append((name, None))
    return tuple(out)
