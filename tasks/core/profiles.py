"""Named configuration profiles: one home for a pipeline's knobs, what each knob is, and how a run resolves them.

A pipeline declares its knobs once (`Knob`: JSON schema of a set value + description) and a few named profiles that
give every knob a value (`demo` for this machine's demo and tests, `full` for a real-size run). A DAG run picks a
profile (the `profile` param, else the deployment's RECFLOW_PROFILE) and may override single knobs; a param left
empty means "the profile's value". `resolve_knobs` is the only place where the three meet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Knob:
    """One tunable: the JSON schema a set value must satisfy, and what it means (shown in the trigger form)."""

    schema: Mapping[str, Any]
    description: str
    title: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class ProfileError(ValueError):
    """An unknown profile, or a profile that does not give every knob a value."""


def check_profiles(knobs: Mapping[str, Knob], profiles: Mapping[str, Mapping[str, Any]]) -> None:
    """Every profile sets exactly the declared knobs (a knob missing from one profile is a bug, not a default)."""
    for name, values in profiles.items():
        missing, unknown = sorted(set(knobs) - set(values)), sorted(set(values) - set(knobs))
        if missing or unknown:
            raise ProfileError(f"profile {name!r}: missing knobs {missing}, unknown knobs {unknown}")


def resolve_knobs(knobs: Mapping[str, Knob], profiles: Mapping[str, Mapping[str, Any]], profile: str,
                  params: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's values with every knob the params set (not None) overriding it."""
    if profile not in profiles:
        raise ProfileError(f"unknown profile {profile!r}: expected one of {', '.join(sorted(profiles))}")
    values = dict(profiles[profile])
    values.update({name: params[name] for name in knobs if params.get(name) is not None})
    return values
