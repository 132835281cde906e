"""One loader for every section of the broker's configuration file.

A section is a frozen dataclass whose fields are its settings; :func:`setting` declares a field's
default and its constraints (a list of choices, a range), and the field's annotation its type.
:func:`load_section` builds a section from the mapping the YAML file holds and refuses, with a
:class:`ConfigError` whose message names the key path, any key the section does not declare
("unknown key http2.max_frame_sizee"), any value of the wrong type and any value outside its
constraints ("sync: expected one of always|interval|never, got 'x'").  A section that is itself a
field of another is loaded by the same loader one path level deeper.

A section that accepts other spellings of its values (Danube's "DeadLetter" for ``dead_letter``)
declares a classmethod ``prepare_section(data)`` that rewrites them before the checks.  A section
whose file layout is not its fields (units converted, paths resolved, presets filled in)
declares a classmethod ``parse_section(data, path)``; the loader hands it the mapping, the hook
checks the keys with :func:`load_fields` against a dataclass of the file's keys (``StorageKeys``)
or its own fields, builds the section, and what it raises names the key paths too.

The same checks run when a section is built in code (``check_settings`` in ``__post_init__``), so
flags and tests cannot build a section the file could not hold.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from functools import cache
from typing import Any, Mapping

from danube.errors import InvalidArgumentError

_UNSET: Any = dataclasses.MISSING


class ConfigError(InvalidArgumentError, ValueError):
    """A setting of the configuration is invalid; the message names its key path.

    ``key`` is that path (``None`` when the problem is not one key's); ``problem`` the rest."""

    def __init__(self, key: str | None, problem: str | None = None) -> None:
        if problem is None:  # a whole sentence of its own
            key, problem = None, key or ""
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}" if key else problem)

    def under(self, path: str) -> "ConfigError":
        """The same error with its key path placed under ``path``."""
        if not path:
            return self
        if self.key is None:
            return ConfigError(path, self.problem)
        if self.key.startswith("unknown key "):
            return ConfigError(f"unknown key {_join(path, self.key[len('unknown key ') :])}", self.problem)
        return ConfigError(_join(path, self.key), self.problem)


def setting(
    default: Any = _UNSET,
    *,
    factory: Any = _UNSET,
    choices: tuple[str, ...] | None = None,
    aliases: Mapping[str, str] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    in_file: bool = True,
    compare: bool = True,
    repr: bool = True,
) -> Any:
    """A settings field: its default (or ``factory``) and constraints.

    ``choices``: the values a string may take (``aliases`` maps former spellings onto them);
    ``minimum``/``maximum``: inclusive bounds of a number; ``above``: an exclusive lower bound;
    ``in_file=False``: not a key of the file (derived from other keys)."""
    meta = {
        "choices": choices,
        "aliases": dict(aliases or {}),
        "minimum": minimum,
        "maximum": maximum,
        "above": above,
        "in_file": in_file,
    }
    if factory is not _UNSET:
        return dataclasses.field(default_factory=factory, metadata=meta, compare=compare, repr=repr)
    return dataclasses.field(default=default, metadata=meta, compare=compare, repr=repr)


def load_section(cls: type, data: Any, path: str, **context: Any) -> Any:
    """``cls`` built from ``data`` (the file's mapping at ``path``; ``None`` = every default).

    ``context`` goes to a section's own ``parse_section`` (e.g. the directory relative paths are
    resolved against); a declarative section takes none.  Raises :class:`ConfigError`."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(path or None, f"expected a mapping of settings, got {_show(data)}")
    prepare = getattr(cls, "prepare_section", None)
    if prepare is not None:  # former or foreign spellings of values, before they are checked
        data = prepare(data)
    parse = getattr(cls, "parse_section", None)
    if parse is not None:
        try:
            return parse(data, path, **context)
        except ConfigError:
            raise
        except InvalidArgumentError as exc:  # its parser's sentence names the key already
            raise ConfigError(None, str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(path or None, str(exc)) from None
    values = load_fields(cls, data, path)
    try:
        return cls(**values)
    except ConfigError as exc:
        raise exc.under(path) from None
    except (TypeError, ValueError, InvalidArgumentError) as exc:
        raise ConfigError(path or None, str(exc)) from None


def load_fields(cls: type, data: Mapping[Any, Any], path: str) -> dict[str, Any]:
    """The keyword arguments of ``cls`` that ``data`` gives, each checked (see :func:`load_section`)."""
    specs = _fields(cls)
    bad = sorted(
        (k for k in data if not isinstance(k, str) or k not in specs or not specs[k].metadata.get("in_file", True)),
        key=str,
    )
    if bad:
        known = [name for name, f in specs.items() if f.metadata.get("in_file", True)]
        close = difflib.get_close_matches(str(bad[0]), known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"the settings here are {', '.join(known)}"
        raise ConfigError(f"unknown key {_join(path, str(bad[0]))}", f"not a setting ({hint})")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = _join(path, name)
        section = _section_type(hints[name])
        if section is not None and (value is None or isinstance(value, Mapping)):
            values[name] = None if value is None and _optional(hints[name]) else load_section(section, value, key)
            continue
        if value is None and typing.get_origin(hints[name]) is tuple:
            continue  # a YAML list key left empty (``key:``): its default, as an empty section is
        values[name] = check_value(value, hints[name], specs[name].metadata, key)
    return values


def check_settings(instance: Any) -> None:
    """Every field of ``instance`` against its type and constraints (for ``__post_init__``)."""
    cls: Any = type(instance)
    hints = _hints(cls)
    for name, spec in _fields(cls).items():
        value = getattr(instance, name)
        checked = check_value(value, hints[name], spec.metadata, name)
        if checked is not value:
            object.__setattr__(instance, name, checked)


def check_value(value: Any, hint: Any, meta: Mapping[str, Any], key: str) -> Any:
    """``value`` as the type ``hint`` wants it (an int for a float, a list as a tuple, an alias
    as its name), or :class:`ConfigError` naming ``key``."""
    if value is None:
        if _optional(hint) or hint is Any:
            return None
        raise ConfigError(key, f"expected {_describe(hint, meta)}, got null")
    hint = _strip_optional(hint)
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {_show(value)}")
        return value
    if hint is int or hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected {_describe(hint, meta)}, got {_show(value)}")
        if hint is int and not isinstance(value, int):
            if not (math.isfinite(value) and value == int(value)):
                raise ConfigError(key, f"expected {_describe(hint, meta)}, got {_show(value)}")
            value = int(value)
        if not math.isfinite(value):
            raise ConfigError(key, f"expected {_describe(hint, meta)}, got {_show(value)}")
        _check_range(value, meta, key, hint)
        return float(value) if hint is float and type(value) is not float else value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected {_describe(hint, meta)}, got {_show(value)}")
        value = meta.get("aliases", {}).get(value, value)
        choices = meta.get("choices")
        if choices and value not in choices:
            raise ConfigError(key, f"expected one of {'|'.join(choices)}, got {_show(value)}")
        return value
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {_show(value)}")
        item = typing.get_args(hint)[0]
        return tuple(check_value(v, item, {}, f"{key}[{i}]") for i, v in enumerate(value))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            raise ConfigError(key, f"expected a mapping of settings, got {_show(value)}")
        return value
    return value


def describe_section(cls: type, path: str = "") -> list[tuple[str, str, Any]]:
    """``(key path, type, default)`` of every setting of ``cls`` (nested sections expanded)."""
    rows: list[tuple[str, str, Any]] = []
    hints = _hints(cls)
    for name, spec in _fields(cls).items():
        if not spec.metadata.get("in_file", True):
            continue
        key = _join(path, name)
        section = _section_type(hints[name])
        if section is not None and getattr(section, "parse_section", None) is None:
            rows.extend(describe_section(section, key))
            continue
        default = spec.default if spec.default is not _UNSET else None
        rows.append((key, _describe(hints[name], spec.metadata), default))
    return rows


# ---------------------------------------------------------------- helpers


@cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(hint: Any) -> bool:
    return _is_union(hint) and type(None) in typing.get_args(hint)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _strip_optional(hint: Any) -> Any:
    if _is_union(hint):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _section_type(hint: Any) -> type | None:
    inner = _strip_optional(hint)
    return inner if isinstance(inner, type) and dataclasses.is_dataclass(inner) else None


def _check_range(value: float, meta: Mapping[str, Any], key: str, hint: Any) -> None:
    low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
    if (
        (low is not None and value < low)
        or (high is not None and value > high)
        or (above is not None and value <= above)
    ):
        raise ConfigError(key, f"expected {_describe(hint, meta)}, got {_show(value)}")


def _describe(hint: Any, meta: Mapping[str, Any]) -> str:
    hint = _strip_optional(hint)
    if meta.get("choices"):
        return f"one of {'|'.join(meta['choices'])}"
    if hint is bool:
        return "true or false"
    if hint is int or hint is float:
        what = "an integer" if hint is int else "a number"
        low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("above")
        if low is not None and high is not None:
            return f"{what} in {_num(low)}..{_num(high)}"
        if above is not None:
            return f"{what} > {_num(above)}"
        if low is not None:
            return f"{what} >= {_num(low)}"
        if high is not None:
            return f"{what} <= {_num(high)}"
        return what
    if hint is str:
        return "a string"
    if typing.get_origin(hint) is tuple:
        return "a list"
    if dataclasses.is_dataclass(hint):
        return "a mapping of settings"
    return str(hint)


def _num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:64] + "…"


__all__ = ["ConfigError", "check_settings", "check_value", "describe_section", "load_fields", "load_section", "setting"]
