"""Plugin parameters as typed dataclasses, parsed strictly.

Each plugin declares a `Params` dataclass; its defaults are the one place a default
lives. Field names are snake_case in Python and camelCase in YAML (`max_num_of_endpoints`
↔ `maxNumOfEndpoints`); `param(aliases=...)` accepts older upstream spellings. A file
whose upstream spells keys in kebab-case (the planner's, after Dynamo's flags:
`adjustment-interval`) passes `style="kebab"`; the rules and errors are the same.
Unknown keys, wrong types and out-of-range values are errors naming the field and the
accepted values: upstream's lenient decoding silently dropped misspelt parameters.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

from epp.config.errors import ConfigError

_MISSING = dataclasses.MISSING


def param(
    default: Any = _MISSING,
    *,
    default_factory: Any = _MISSING,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[Any, ...] | None = None,
    aliases: tuple[str, ...] = (),
    doc: str = "",
) -> Any:
    meta = {"min": min, "max": max, "choices": choices, "aliases": aliases, "doc": doc}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


KeyStyle = typing.Literal["camel", "kebab"]


def yaml_name(field_name: str, style: KeyStyle = "camel") -> str:
    if style == "kebab":
        return field_name.replace("_", "-")
    head, *rest = field_name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _type_label(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_label(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_type_label(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a map"
    if dataclasses.is_dataclass(tp):
        return "an object"
    return {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(value: Any, tp: Any, path: str, style: KeyStyle = "camel") -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, path, style)
            except ConfigError:
                continue
        raise ConfigError(path, f"must be {_type_label(tp)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(path, f"must be {_type_label(tp)}, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{path}[{i}]", style) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"must be a map, got {value!r}")
        _, val_tp = typing.get_args(tp)
        return {str(k): _convert(v, val_tp, f"{path}.{k}", style) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return parse_params(tp, value, path, style=style)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    raise ConfigError(path, f"must be {_type_label(tp)}, got {value!r}")


def fields_by_yaml_name(cls: type, style: KeyStyle = "camel") -> dict[str, dataclasses.Field]:
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        out[yaml_name(f.name, style)] = f
        for alias in f.metadata.get("aliases", ()):
            out[alias] = f
    return out


def parse_params(
    cls: type, raw: Any, path: str = "parameters", *, style: KeyStyle = "camel"
) -> Any:
    """Build `cls` from a YAML mapping; every problem raises ConfigError at `path`."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(path, f"must be a map of parameters, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = fields_by_yaml_name(cls, style)
    values: dict[str, Any] = {}
    seen_from: dict[str, str] = {}
    for key, value in raw.items():
        key = str(key)
        f = known.get(key)
        if f is None:
            accepted = sorted(yaml_name(x.name, style) for x in dataclasses.fields(cls))
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            listed = ", ".join(accepted) if accepted else "none (this plugin takes no parameters)"
            raise ConfigError(
                f"{path}.{key}", f"unknown parameter{hint} Accepted parameters: {listed}"
            )
        if f.name in seen_from:
            raise ConfigError(
                f"{path}.{key}", f"given twice (also as '{seen_from[f.name]}'); keep one"
            )
        seen_from[f.name] = key
        converted = _convert(value, hints[f.name], f"{path}.{key}", style)
        _check_range(converted, f, f"{path}.{key}")
        values[f.name] = converted
    for f in dataclasses.fields(cls):
        if (
            f.name not in values and f.default is _MISSING and f.default_factory is _MISSING  # type: ignore[misc]
        ):
            raise ConfigError(f"{path}.{yaml_name(f.name, style)}", "is required")
    try:
        obj = cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(path, str(e)) from None
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as e:
            raise ConfigError(path, str(e)) from None
    return obj


def _check_range(value: Any, f: dataclasses.Field, path: str) -> None:
    lo, hi, choices = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(path, f"must be one of {', '.join(map(str, choices))}; got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if lo is not None and value < lo:
            raise ConfigError(path, f"must be at least {lo}; got {value}")
        if hi is not None and value > hi:
            raise ConfigError(path, f"must be at most {hi}; got {value}")


def describe(cls: type, style: KeyStyle = "camel") -> list[tuple[str, str, Any, str]]:
    """(yaml name, type, default, doc) per parameter: for docs and `epp plugins`."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not _MISSING
            else (
                f.default_factory() if f.default_factory is not _MISSING else None  # type: ignore[misc]
            )
        )
        rows.append(
            (
                yaml_name(f.name, style),
                _type_label(hints[f.name]),
                default,
                f.metadata.get("doc", ""),
            )
        )
    return rows


@dataclasses.dataclass(frozen=True)
class NoParams:
    """For plugins that take no parameters."""
