"""Typed field checks, the dataclass parser and the safe JSON reader shared by every config.

One place decides what a valid field *type* is, for run configs, audit configs and the dashboard's
URL parameters alike:

* ``check_int / check_number / check_positive / check_str / check_bool / check_choice / check_list``
  check one value and raise one :class:`ConfigError` naming the dotted field; none lets a
  ``TypeError``, ``ValueError`` or ``OverflowError`` escape, whatever the (JSON) value is;
* :func:`parse_section` builds a frozen dataclass from a JSON object, checking every field against its
  annotation (:func:`parse_value`); :func:`check_section` applies the same checks to an instance built
  in Python;
* :func:`read_config_text` / :func:`parse_config_json` read a config file or string: only regular files
  of at most :data:`MAX_CONFIG_BYTES`, UTF-8 only, and decoding / nesting / huge-number failures become
  ``config: …`` one-liners.

Range checks that depend on the meaning of a field live in each config's ``validate()``
(``engine.config.run``, ``engine.audit``), written with these helpers.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import stat
from typing import Any

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config file (or URL value) larger than this is refused unread


class ConfigError(ValueError):
    """An invalid run configuration. ``field`` is the dotted path of the bad field."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")

    def __reduce__(self):  # pickled as (field, message): it crosses to a Ray driver (engine.jobs.ray_jobs)
        return type(self), (self.field, self.message), self.__dict__

    def under(self, prefix: str) -> "ConfigError":
        """The same error with ``prefix`` put before its field (``e.under("run.")``: ``run.data.name``)."""
        field = prefix.rstrip(".") if self.field == "config" else prefix + self.field
        return ConfigError(field, self.message)


# --- typed field checks (shared by every config type: run, audit, URL parameters) -----------------
# Each returns the value unchanged when it is valid and raises one ConfigError naming ``field``
# otherwise; none lets a TypeError/ValueError/OverflowError escape, whatever the value is.

def _show(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a (possibly hostile) value for an error message."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int over Python's int-string limit
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _type_name(value: Any) -> str:
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number", list: "a list",
            tuple: "a list", dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def check_int(value: Any, field: str, low: int | None = None, high: int | None = None) -> int:
    """An integer (not a bool, float or string) with ``low <= value <= high`` (bounds inclusive)."""
    if not isinstance(value, int) or isinstance(value, bool):  # numpy ints too: they are not JSON
        raise ConfigError(field, f"must be an integer, got {_type_name(value)} {_show(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"<= {high}" if low is None else f"in {low}..{high}"
        raise ConfigError(field, f"must be an integer {rng}, got {_show(value)}")
    return value


def check_number(value: Any, field: str, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False) -> float:
    """A finite int or float (not a bool or string) in the interval [low, high]; ``low_open`` /
    ``high_open`` exclude the bound. Returns the value unchanged (an int stays an int)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(field, f"must be a number, got {_type_name(value)} {_show(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        raise ConfigError(field, f"is too large ({_show(value, 24)})") from None
    if not finite:
        raise ConfigError(field, f"must be a finite number, got {_show(value)}")
    if (low is not None and (value <= low if low_open else value < low)) or \
            (high is not None and (value >= high if high_open else value > high)):
        lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
        if low is None:
            rng = f"{'<' if high_open else '<='} {high:g}"
        elif high is None:
            rng = f"{'>' if low_open else '>='} {low:g}"
        else:
            rng = f"in {lo}, {hi}"
        raise ConfigError(field, f"must be a number {rng}, got {_show(value)}")
    return value


def check_positive(value: Any, field: str) -> float:
    """A finite number > 0."""
    return check_number(value, field, 0, None, low_open=True)


def check_str(value: Any, field: str, *, max_len: int = 1000, nonempty: bool = False) -> str:
    """A string without NUL bytes, at most ``max_len`` characters (non-empty if asked)."""
    if not isinstance(value, str):
        raise ConfigError(field, f"must be a string, got {_type_name(value)} {_show(value)}")
    if "\x00" in value:
        raise ConfigError(field, "must not contain a NUL byte")
    if len(value) > max_len:
        raise ConfigError(field, f"must be at most {max_len} characters, got {len(value)}")
    if nonempty and not value.strip():
        raise ConfigError(field, "must not be empty")
    return value


def check_bool(value: Any, field: str) -> bool:
    """true or false (not 0/1 or a string)."""
    if not isinstance(value, bool):
        raise ConfigError(field, f"must be true or false, got {_type_name(value)} {_show(value)}")
    return value


def check_choice(value: Any, field: str, allowed) -> str:
    """One of the ``allowed`` strings."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(field, f"unknown value {_show(value)}; allowed: {', '.join(allowed)}")
    return value


def check_list(value: Any, field: str, *, max_len: int | None = None, nonempty: bool = False) -> tuple:
    """A JSON list (a tuple or list in Python), at most ``max_len`` long; returned as a tuple."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(field, f"must be a list, got {_type_name(value)} {_show(value)}")
    if max_len is not None and len(value) > max_len:
        raise ConfigError(field, f"must have at most {max_len} entries, got {len(value)}")
    if nonempty and not value:
        raise ConfigError(field, "must not be empty")
    return tuple(value)


_SCALARS = {int: check_int, float: check_number, str: check_str, bool: check_bool}


@functools.lru_cache(maxsize=None)
def _field_types(cls) -> dict:
    import typing

    return typing.get_type_hints(cls)


def parse_value(hint: Any, value: Any, path: str, *, convert: bool = True) -> Any:
    """Check ``value`` against a field's type annotation and return it in its frozen form (JSON lists
    become tuples, objects become the annotated dataclass). Supported: ``int``, ``float``, ``str``,
    ``bool``, ``X | None``, ``tuple[X, ...]``, ``tuple[X, Y]``, and nested dataclasses. ``convert=False``
    only checks (dataclass values must then already be instances)."""
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return parse_value(rest[0], value, path, convert=convert)
        return value  # a union the schema does not describe: the owner's validate() checks it
    if origin is tuple:
        args = typing.get_args(hint)
        items = check_list(value, path)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(parse_value(args[0], v, f"{path}[{k}]", convert=convert) for k, v in enumerate(items))
        if len(items) != len(args):
            raise ConfigError(path, f"must be a list of {len(args)} entries, got {_show(value)}")
        return tuple(parse_value(a, v, f"{path}[{k}]", convert=convert) for k, (a, v) in enumerate(zip(args, items)))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return check_section(value, path + ".") if not convert else value
        if not convert:
            raise ConfigError(path, f"must be a {hint.__name__}, got {_type_name(value)} {_show(value)}")
        return parse_section(hint, value, path + ".")
    if hint in _SCALARS:
        return _SCALARS[hint](value, path)
    return value  # unannotated / Any: the owner's validate() checks it


def parse_section(cls, data: Any, prefix: str = "", *, parsers: dict | None = None):
    """Build the frozen dataclass ``cls`` from a JSON object, checking every field's type from its
    annotation (see :func:`parse_value`); unknown fields, missing required fields and wrong types raise
    one ConfigError naming the dotted field (``prefix`` + name, e.g. ``"run.data."``). ``parsers`` maps
    a field name to ``fn(value, path) -> parsed`` for fields the annotation cannot describe."""
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(where, f"must be a JSON object, got {_type_name(data)} {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise ConfigError(prefix + unknown[0], f"unknown field; allowed: {', '.join(sorted(fields))}")
    hints = _field_types(cls)
    kwargs = {}
    for name, value in data.items():
        path = prefix + name
        if parsers and name in parsers:
            kwargs[name] = parsers[name](value, path)
        else:
            kwargs[name] = parse_value(hints.get(name, Any), value, path)
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(prefix + missing[0], "is required")
    return cls(**kwargs)


def check_section(obj, prefix: str = "", *, skip: tuple[str, ...] = ()):
    """Type-check every field of a dataclass instance built in Python (same rules as
    :func:`parse_section`; nested dataclasses are checked too). Returns ``obj``."""
    hints = _field_types(type(obj))
    for f in dataclasses.fields(obj):
        if f.name not in skip:
            parse_value(hints.get(f.name, Any), getattr(obj, f.name), prefix + f.name, convert=False)
    return obj


def _no_duplicate_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError("config", f"duplicate key {_show(key)} in one JSON object")
        out[key] = value
    return out


def parse_config_json(text: str, *, what: str = "config") -> dict:
    """The JSON object of a configuration; one ConfigError (field ``what``) if it is not valid JSON,
    not an object, too large, too deeply nested, holds a number too long to convert, or repeats a key."""
    if not isinstance(text, str):
        raise ConfigError(what, f"must be text, got {_type_name(text)}")
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(what, f"is {len(text)} characters long; at most {MAX_CONFIG_BYTES} are read")
    try:
        d = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ConfigError as e:
        raise ConfigError(what, e.message) from None
    except json.JSONDecodeError as e:
        raise ConfigError(what, f"not valid JSON: {e}") from None
    except RecursionError:
        raise ConfigError(what, "not valid JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer over Python's int-string conversion limit
        raise ConfigError(what, f"not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(d, dict):
        raise ConfigError(what, "the top level must be a JSON object")
    return d


def read_config_text(path: str) -> str:
    """A configuration file's text (JSON only: configs are never unpickled). Refuses, before reading,
    anything that is not a regular file (a directory, ``/dev/zero``, a FIFO) and files over
    :data:`MAX_CONFIG_BYTES`; the text must be UTF-8 (a UTF-8 byte-order mark is allowed)."""
    if not isinstance(path, (str, os.PathLike)) or "\x00" in os.fspath(path):
        raise ConfigError("config", f"not a usable file name: {_show(path)}")
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not block; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ConfigError("config", f"cannot read {path}: {kind}")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError("config", f"{path} is {info.st_size} bytes; a config may be at most {MAX_CONFIG_BYTES}")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = None
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from None
    finally:
        if fd is not None:
            os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:  # grew while being read
        raise ConfigError("config", f"{path} is over {MAX_CONFIG_BYTES} bytes; a config may be at most that")
    utf16 = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in data[:64] else ""
    if b"\x00" in data:
        raise ConfigError("config", f"{path} is not UTF-8 text{utf16}: it contains NUL bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError("config", f"{path} is not UTF-8 text{utf16}: invalid byte at position {e.start}") from None


def replace_dotted(obj, key: str, value, *, checked: bool = False):
    """A copy of the dataclass tree ``obj`` with the field at the dotted path ``key`` (``"algorithm.name"``,
    an audit's ``"run.epochs"``) set to ``value`` — the one walk of a dotted config path (``RunConfig.replace``,
    ``AuditConfig.replace``, the CLI's ``--set``). ``checked``: unknown fields raise a ConfigError naming
    the allowed ones, and ``value`` (JSON) is type-checked against the field's annotation first."""
    parts = key.split(".")
    if checked:
        node, hint = obj, None
        for depth, part in enumerate(parts):
            if not dataclasses.is_dataclass(node):
                raise ConfigError(key, f"{'.'.join(parts[:depth])} is not a section")
            names = [f.name for f in dataclasses.fields(node)]
            if part not in names:
                raise ConfigError(".".join(parts[:depth + 1]), f"unknown field; allowed: {', '.join(sorted(names))}")
            hint = _field_types(type(node)).get(part)
            node = getattr(node, part)
        value = parse_value(hint, value, key)
    return _replace_path(obj, parts, value)


def _replace_path(obj, path: list[str], value):
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _replace_path(getattr(obj, path[0]), path[1:], value)})
