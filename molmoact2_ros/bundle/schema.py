"""Typed checks of the bundle's JSON files: every refusal names the file, the field and what
is allowed, so a wrong value never loads silently (``"false"`` as a boolean, q01 > q99, ...)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BundleError

_KIND_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "an object"}


@dataclass(frozen=True)
class Field:
    """One JSON field: its type, whether it must be there, and its allowed values if few."""

    name: str
    kind: type
    required: bool = False
    choices: tuple = ()
    minimum: float | None = None


def read_json_object(path: Path, what: str) -> dict:
    """Parse ``path`` as a JSON object, or raise one line naming the file and the fix."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{path} is missing; the bundle needs {what}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); regenerate {what}") from None
    except OSError as exc:
        raise BundleError(f"{path} cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: the top level is a {_json_type(data)}; {what} is an object")
    return data


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def is_kind(value: Any, kind: type) -> bool:
    """JSON type test where a boolean is not a number and an integer is a valid number."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    return isinstance(value, kind)


def check_fields(path: Path, data: Mapping, fields: tuple[Field, ...], *, where: str = "",
                 allow_unknown: bool = True) -> dict:
    """Check ``data`` against ``fields``; returns the known fields (numbers as float)."""
    prefix = f"{path}: {where}" if where else f"{path}: "
    known = {f.name for f in fields}
    if not allow_unknown:
        unknown = sorted(set(data) - known)
        if unknown:
            raise BundleError(f"{prefix}unknown keys {unknown}; known keys are {sorted(known)}")
    out = {}
    for f in fields:
        if f.name not in data:
            if f.required:
                raise BundleError(f"{prefix}{f.name} is missing; it must be "
                                  f"{_KIND_WORDS[f.kind]}")
            continue
        value = data[f.name]
        if not is_kind(value, f.kind):
            hint = " (write true/false without quotes)" if f.kind is bool and isinstance(
                value, str) else ""
            raise BundleError(f"{prefix}{f.name} is {value!r} ({_json_type(value)}); it must be "
                              f"{_KIND_WORDS[f.kind]}{hint}")
        if f.choices and value not in f.choices:
            raise BundleError(f"{prefix}{f.name} is {value!r}; allowed: "
                              + ", ".join(repr(c) for c in f.choices))
        if f.minimum is not None and value < f.minimum:
            raise BundleError(f"{prefix}{f.name} is {value!r}; it must be >= {f.minimum}")
        out[f.name] = float(value) if f.kind is float else value
    return out


def check_list(path: Path, value: Any, name: str, kind: type, *, where: str = "") -> list:
    """A JSON list whose items all have ``kind``."""
    prefix = f"{path}: {where}"
    if not isinstance(value, list):
        raise BundleError(f"{prefix}{name} is a {_json_type(value)}; it must be a list of "
                          f"{_KIND_WORDS[kind].split(' ', 1)[-1]}s")
    for i, item in enumerate(value):
        if not is_kind(item, kind):
            hint = " (write true/false without quotes)" if kind is bool and isinstance(
                item, str) else ""
            raise BundleError(f"{prefix}{name}[{i}] is {item!r} ({_json_type(item)}); every "
                              f"item must be {_KIND_WORDS[kind]}{hint}")
    return value


def check_manifest(path: Path, data: Mapping, variants: tuple[str, ...]) -> dict:
    """``bundle.json``: an optional variant name plus free-form provenance."""
    return check_fields(path, data, (
        Field("variant", str, choices=variants),
        Field("format", str),
        Field("seed", int),
        Field("synthetic", bool),
    ))
