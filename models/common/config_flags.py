"""A trainer's config dataclass as its command line: one `--<field>` per field, NVIDIA-style underscore flags.

Each field is declared once with `option(default, help, **extra)` (extra: `type` where the default's type is not
the flag's, e.g. `int` for a None default; `choices`); `add_config_flags` writes the flags from the fields, and
`namespace_values` / `config_dict` / `config_from_dict` turn parsed flags, the config and a saved config back and
forth. Tuples are lists in JSON (and in torch's weights_only loading).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import field
from typing import Any, TypeVar

Config = TypeVar("Config")


def option(default: Any, help: str, **extra: Any) -> Any:  # noqa: A002 - argparse's own word
    """A config field with its default, its flag's help and extra argparse settings (type, choices)."""
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata={"help": help, **extra})
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help, **extra})
    return field(default=default, metadata={"help": help, **extra})


def add_boolean_flag(parser: argparse.ArgumentParser, name: str, kwargs: dict[str, Any]) -> None:
    """`--<name>` / `--no-<name>`."""
    parser.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, **kwargs)


def add_config_flags(parser: argparse.ArgumentParser, config_cls: type,
                     add_bool: Callable[[argparse.ArgumentParser, str, dict[str, Any]], None] = add_boolean_flag,
                     tuple_item: Callable[[str], Any] = int) -> argparse.ArgumentParser:
    """One `--<field>` per field of `config_cls`, its default that of the class; a bool flag is added by `add_bool`,
    a tuple takes one or more values of `tuple_item`."""
    defaults = config_cls()
    for f in dataclasses.fields(config_cls):
        default = getattr(defaults, f.name)
        kwargs: dict[str, Any] = {"help": f"{f.metadata['help']} (default: {default})", "default": default}
        if isinstance(default, bool):
            add_bool(parser, f.name, kwargs)
            continue
        if isinstance(default, tuple):
            kwargs.update(nargs="+", type=tuple_item)
        else:
            kwargs["type"] = f.metadata.get("type", type(default))
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(f"--{f.name}", **kwargs)
    return parser


def namespace_values(config_cls: type, namespace: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags that are fields of `config_cls`."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    return {k: v for k, v in vars(namespace).items() if k in names}


def config_dict(config: Any) -> dict[str, Any]:
    """Plain dict of ints/floats/strs/lists/None (safe for JSON and for torch weights_only loading)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def config_from_dict(config_cls: type[Config], values: dict[str, Any], what: str) -> Config:
    """`config_cls(**values)`, refusing keys it does not have (`what` names the config in the error)."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {what} config keys {unknown}")
    return config_cls(**values)
