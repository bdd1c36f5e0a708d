"""Locating, downloading and checksum-verifying data files.

* :func:`data_dir`: explicit argument > ``$PRIVACY_LAB_DATA_DIR`` > ``~/.cache/privacy-imbalance-lab/data``.
* Every known file has a pinned sha256 and decompressed size (:data:`KNOWN_FILES`). A file is
  verified when first read; successful verifications are cached per (path, mtime, size).
* Checksum first, decompression after: the sha256 of the *stored* bytes is compared before anything
  is decompressed, and decompression streams under a cap (the pinned size of the original, else
  :data:`MAX_DECOMPRESSED_BYTES`), so a decompression bomb is refused quickly with little memory.
  Files larger than a known file can be are refused before they are read.
  Accepted variants: the uncompressed original itself (``adult.data`` for ``adult.data.gz``, checked
  against the pinned raw sha256), and a re-compressed ``.gz`` whose gzip trailer states the original's
  size; only that one is decompressed (under the cap) to compare the raw sha256.
* A missing file with a known direct URL is downloaded (urllib, 10 s socket timeout) into a temporary
  folder, its sha256 checked, and only then moved into place (the data folder is created at that
  moment, not before). ``PRIVACY_LAB_OFFLINE=1`` disables downloads.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import threading
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError

ENV_VAR = "PRIVACY_LAB_DATA_DIR"
OFFLINE_ENV_VAR = "PRIVACY_LAB_OFFLINE"
DEFAULT_DATA_DIR = Path("~/.cache/privacy-imbalance-lab/data")
REPO_ROOT = Path(__file__).resolve().parents[2]
# A checkout (or an editable install) has assets/ at its root; `pip install .` puts them in privacy_lab_app/.
ASSETS_DIR = next((p for p in (REPO_ROOT / "assets", REPO_ROOT / "privacy_lab_app" / "assets") if p.is_dir()),
                  REPO_ROOT / "assets")
DOWNLOAD_TIMEOUT_S = 10.0
MAX_DECOMPRESSED_BYTES = 256 << 20  # decompression cap of a file whose original size is not pinned
MAX_FILE_BYTES = 512 << 20  # largest data file read or downloaded at all (CIFAR tarballs are 170 MB)
_CHUNK = 1 << 20


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """Root data folder: ``explicit`` > env ``PRIVACY_LAB_DATA_DIR`` > ``~/.cache/privacy-imbalance-lab/data``.

    Relative paths are resolved against the current working directory. The folder need not exist; a file
    in its place is a DataError (not a silent fall-back to the shipped copies).
    """
    if explicit is not None and str(explicit) != "":
        p, source = Path(explicit), "the data folder"
    elif os.environ.get(ENV_VAR):
        p, source = Path(os.environ[ENV_VAR]), f"${ENV_VAR}"
    else:
        p, source = DEFAULT_DATA_DIR, "the default data folder"
    p = p.expanduser().resolve()
    if p.exists() and not p.is_dir():
        raise DataError(f"{source} {p} is a file, not a folder: give the folder that holds mnist/, adult/ …")
    return p


@dataclass(frozen=True)
class KnownFile:
    name: str  # file name as looked up, e.g. "adult.data.gz"
    sha256: str  # sha256 of the file's bytes as stored
    raw_sha256: str | None = None  # sha256 of the decompressed content (".gz" files only)
    url: str | None = None  # direct download URL (None: manual download only)
    url_is_raw: bool = False  # True: the URL serves the uncompressed content (saved without ".gz")
    info_url: str | None = None  # page to point users at
    md5: str | None = None  # extra check (CIFAR)
    raw_size: int | None = None  # size in bytes of the decompressed content (".gz" files): the cap

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
        raw_size=47040016,
    ),
    "mnist/train-labels-idx1-ubyte.gz": KnownFile(
        "train-labels-idx1-ubyte.gz",
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        url=f"{_MNIST_URL}/train-labels-idx1-ubyte.gz",
        raw_size=60008,
    ),
    "mnist/t10k-images-idx3-ubyte.gz": KnownFile(
        "t10k-images-idx3-ubyte.gz",
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        url=f"{_MNIST_URL}/t10k-images-idx3-ubyte.gz",
        raw_size=7840016,
    ),
    "mnist/t10k-labels-idx1-ubyte.gz": KnownFile(
        "t10k-labels-idx1-ubyte.gz",
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        url=f"{_MNIST_URL}/t10k-labels-idx1-ubyte.gz",
        raw_size=10008,
    ),
    "adult/adult.data.gz": KnownFile(
        "adult.data.gz",
        "c7a2b4716a97f930123e0baf879188d701e798172631a654fc703d4b082907f3",
        "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
        url=f"{_UCI}/adult/adult.data",
        url_is_raw=True,
        info_url="https://archive.ics.uci.edu/dataset/2/adult",
        raw_size=3974305,
    ),
    "adult/adult.test.gz": KnownFile(
        "adult.test.gz",
        "8a2c1bffa6e7ce5abfa43881ae5e87c4311ebc2b3cd526c9c40a43f19f06f799",
        "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
        url=f"{_UCI}/adult/adult.test",
        url_is_raw=True,
        info_url="https://archive.ics.uci.edu/dataset/2/adult",
        raw_size=2003153,
    ),
    "bank_marketing/bank-full.csv.gz": KnownFile(
        "bank-full.csv.gz",
        "a33820520e31d26b498e31003e99eb0e477690b699a38eade375acf3b3004dcd",
        "d1513ec63b385506f7cfce9f2c5caa9fe99e7ba4e8c3fa264b3aaf0f849ed32d",
        info_url="https://archive.ics.uci.edu/dataset/222/bank+marketing (bank.zip inside the archive)",
        raw_size=4610348,
    ),
    "credit_default/default_of_credit_card_clients.csv.gz": KnownFile(
        "default_of_credit_card_clients.csv.gz",
        "fad968254e68183c43ebbe35adfa588c0e5073a816b811495646f511d79a0472",
        "4edce6da569b2c30788a85fd98a9bafb1a983e8ca1a7aac875dd7ff853cbd0bb",
        info_url=(
            "https://archive.ics.uci.edu/dataset/350/default+of+credit+card+clients "
            "(the .xls exported as a plain-integer CSV with the ID,...,'default payment next month' header)"
        ),
        raw_size=2867208,
    ),
    "german_credit/german.data.gz": KnownFile(
        "german.data.gz",
        "a4cc977b7fc38d60827f2f881d8377954ece4d7ade5d026e827307bb63395df2",
        "b21f3d81db8071257d5ff1deaeba1fd4303b62712e6fcc9715c7a86202cb5871",
        url=f"{_UCI}/statlog/german/german.data",
        url_is_raw=True,
        info_url="https://archive.ics.uci.edu/dataset/144/statlog+german+credit+data",
        raw_size=79793,
    ),
    "law_school/law_data.csv.gz": KnownFile(
        "law_data.csv.gz",
        "b13c2b601ddbfbcb15b9caf2910396a7ddcb61a2028f88ca3dd3431d340e13fb",
        "cbf494af5e0ac317015cf64945a20587c08ec77118e183d3ddb0026719956d88",
        info_url="https://github.com/mkusner/counterfactual-fairness (law_data.csv, Kusner et al. 2017)",
        raw_size=1087804,
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


def read_capped(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path``, refused (before reading) when larger than ``limit``."""
    path = Path(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise DataError(f"{path} is not a regular file; replace it with the original data file.")
        if st.st_size > limit:
            raise DataError(f"{path} is {st.st_size} bytes, more than the {limit} bytes this data file can have; "
                            "it is not the original: delete it and get the original.")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e}") from e
    if len(data) > limit:
        raise DataError(f"{path} grew beyond {limit} bytes while being read; delete it and get the original.")
    return data


def gzip_stated_size(data: bytes) -> int | None:
    """The decompressed size (mod 2**32) a gzip file's trailer states (ISIZE; a hint, never trusted alone)."""
    return int.from_bytes(data[-4:], "little") if data[:2] == b"\x1f\x8b" and len(data) >= 18 else None


class OverCapError(DataError):
    """A gzip stream that decompresses beyond its cap (a bomb, or not the original): never a "damaged copy"."""


def gunzip_capped(data: bytes, limit: int, path: Path) -> bytes:
    """Decompress gzip ``data`` (one or more members), streaming: refused as soon as the output
    exceeds ``limit`` bytes, so a decompression bomb costs at most ``limit`` bytes of memory."""
    out = bytearray()
    rest = data
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            buf = rest
            while buf and not d.eof:
                out += d.decompress(buf, min(_CHUNK, limit + 1 - len(out)) or 1)
                if len(out) > limit:
                    raise OverCapError(
                        f"{path} decompresses to more than {limit} bytes, the size of the original; refused "
                        "(a decompression bomb or a different file). Delete it and get the original.")
                buf = d.unconsumed_tail
            if not d.eof:
                raise DataError(f"{path} is a truncated gzip file. Delete it and fetch it again.")
            rest = d.unused_data
    except zlib.error as e:
        raise DataError(f"{path} is not a valid gzip file ({e}). Delete it and fetch it again.") from e
    return bytes(out)


def read_verified(path: Path, kf: KnownFile) -> bytes:
    """Read ``path`` (the stored ``.gz`` or its uncompressed variant), check it against ``kf``
    and return the *decompressed* content. Raises :class:`DataError` on a mismatch.

    The checksum of the stored bytes is compared first; decompression comes after, under a cap."""
    path = Path(path)
    cap = kf.raw_size or MAX_DECOMPRESSED_BYTES
    data = read_capped(path, min(MAX_FILE_BYTES, cap + (1 << 20)) if kf.raw_size else MAX_FILE_BYTES)
    try:
        key = _stat_key(path)
    except OSError as e:
        raise DataError(f"Cannot read {path}: {e}") from e
    is_gz = data[:2] == b"\x1f\x8b"
    if _VERIFIED.get(key):
        return gunzip_capped(data, cap, path) if is_gz else data
    sha = sha256_bytes(data)
    raw, note = None, ""
    if sha == kf.sha256:  # the pinned file itself: only now is it decompressed
        raw = gunzip_capped(data, cap, path) if is_gz else data
    elif kf.raw_sha256 and not is_gz:
        raw = data if sha == kf.raw_sha256 else None  # the uncompressed original
    elif kf.raw_sha256 and is_gz:  # maybe the original re-compressed: its trailer must state the original size
        stated = gzip_stated_size(data)
        if kf.raw_size is None or stated == kf.raw_size % (1 << 32):
            try:
                content = gunzip_capped(data, cap, path)
            except OverCapError:  # stopped by the cap: said as such (a bomb is not a damaged copy)
                raise
            except DataError:  # a damaged copy of the pinned file: reported as the mismatch it is
                content, note = None, "; it does not decompress (a damaged gzip stream)"
            raw = content if content is not None and sha256_bytes(content) == kf.raw_sha256 else None
        else:
            note = f"; it states a decompressed size of {stated} bytes, the original has {kf.raw_size}: not decompressed"
    if raw is None:
        raise DataError(
            f"Checksum mismatch for {path}: its sha256 is {sha}, expected "
            f"{kf.sha256}" + (f" (or decompressed content {kf.raw_sha256})" if kf.raw_sha256 else "") + note
            + ". The file is corrupt or a different version; "
            + (_SHIPPED_HINT if _is_shipped(path) else
               "delete it and get the original" + (f" from {kf.where}." if kf.where else "."))
        )
    with _LOCK:
        _VERIFIED[key] = True
    return raw


_SHIPPED_HINT = ("it is the lab's shipped copy (assets/): restore it (git checkout -- assets/, or reinstall the "
                 "package), or put the original files in the data folder, which is read first.")


def _is_shipped(path: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(Path(ASSETS_DIR).resolve())
    except OSError:
        return False


def download_file(url: str, dest: Path, sha256: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Download ``url`` into a temporary folder and move it to ``dest`` only when its sha256 equals
    ``sha256`` (``dest``'s folder is created only then). Raises on any failure, leaving nothing
    behind. Tests monkeypatch this to forbid network use."""
    dest = Path(dest)
    tmp_dir = Path(tempfile.mkdtemp(prefix="privacy-lab-download-"))
    tmp = tmp_dir / dest.name
    h = hashlib.sha256()
    size = 0
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "privacy-imbalance-lab"})
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(tmp, "wb") as out:
            while True:
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_FILE_BYTES:
                    raise DataError(f"download of {url} exceeds {MAX_FILE_BYTES} bytes; refused")
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise DataError(f"downloaded {url} but its sha256 {h.hexdigest()} != expected {sha256}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f".{dest.name}.part{os.getpid()}")
        try:
            shutil.move(str(tmp), str(part))  # a copy when the temporary folder is on another file system
            os.replace(part, dest)  # atomic: readers see the whole file or none
        finally:
            if part.exists():
                part.unlink()
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
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
