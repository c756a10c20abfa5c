"""Named configuration profiles: one home for a pipeline's knobs, what each knob is, and how a run resolves them.

A pipeline declares its knobs once (`Knob`: JSON schema of a set value + description) and a few named profiles that
give every knob a value (`demo` for this machine's demo and tests, `full` for a real-size run). A DAG run picks a
profile (the `profile` param, else the deployment's RECFLOW_PROFILE) and may override single knobs; a param left
empty means "the profile's value". `resolve_knobs` is the only place where the three meet.

Release thresholds (a knob declared with `release="min"` or `"max"`: min_auc, max_regression, ...) are deployment
settings, not form knobs (issue #24): the value a run ends up with, from its profile or its params, may be stricter
than the deployment's (RECFLOW_RELEASE_MIN_VALUE / RECFLOW_RELEASE_MAX_REGRESSION, else the value in the deployment's
RECFLOW_PROFILE) but never looser; a looser one is refused with one line before any work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.core.config import NotAllowed, load_settings


@dataclass(frozen=True)
class Knob:
    """One tunable: the JSON schema a set value must satisfy, and what it means (shown in the trigger form)."""

    schema: Mapping[str, Any]
    description: str
    title: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    release: str | None = None  # "min" / "max": a release threshold a run may only raise / lower


class ReleaseThresholdLoosened(NotAllowed, ValueError):
    """A run asked for a looser release gate than the deployment allows (bad input: not retried)."""


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
    check_release_thresholds(knobs, profiles, profile, values)
    return values


def check_release_thresholds(knobs: Mapping[str, Knob], profiles: Mapping[str, Mapping[str, Any]], profile: str,
                             values: Mapping[str, Any]) -> None:
    """ReleaseThresholdLoosened (one line) when a release knob's value is looser than the deployment's limit:
    RECFLOW_RELEASE_MIN_VALUE / RECFLOW_RELEASE_MAX_REGRESSION, else the knob's value in RECFLOW_PROFILE's profile."""
    release = {name: knob.release for name, knob in knobs.items() if knob.release}
    if not release:
        return
    settings = load_settings()
    deployment = profiles.get(settings.profile, {})
    for name, kind in release.items():
        explicit = settings.release_min_value if kind == "min" else settings.release_max_regression
        setting = "RECFLOW_RELEASE_MIN_VALUE" if kind == "min" else "RECFLOW_RELEASE_MAX_REGRESSION"
        limit = explicit if explicit is not None else deployment.get(name)
        value = values.get(name)
        if limit is None or value is None:
            continue
        looser = value < limit if kind == "min" else value > limit
        if looser:
            source = setting if explicit is not None else f"profile {settings.profile!r} (RECFLOW_PROFILE)"
            change = "lower" if kind == "min" else "raise"
            raise ReleaseThresholdLoosened(
                f"{name}={value} (profile {profile!r} and the trigger form) is looser than the deployment's "
                f"{limit} from {source}: a run may only tighten release thresholds; {change} {setting} to allow it")


def layer_sizes(text: str, *, what: str = "MLP sizes", even_first: bool = False) -> list[int]:
    """A layer-widths knob ('512,256,128') as integers, refused with one line before any work when malformed.
    `even_first`: the first width is split in two halves (NCF's user and item MLP embeddings)."""
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"{what} {text!r} must be comma-separated integers") from None
    if not sizes or any(s < 1 or s > 65536 for s in sizes):
        raise ValueError(f"{what} {text!r} must be between 1 and 65536")
    if even_first and sizes[0] % 2:
        raise ValueError(f"{what} {text!r}: the first width is split in two halves, so it must be even")
    return sizes
