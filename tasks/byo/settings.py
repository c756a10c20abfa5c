"""Bring-your-own dataset's settings: where the feature spec comes from, which engine transcodes the files."""

from __future__ import annotations

from tasks.core.settings_registry import Setting, declare

declare(
    Setting("RECFLOW_BYO_SPEC_URI", "url", "", "the feature_spec.yaml byo_dlrm trains on when a run names none"),
    Setting("RECFLOW_BYO_TRANSCODE_ENGINE", "choice", "", "who transcodes byo's files: `arrow` or `spark`",
            default_note="`arrow` on one machine, `spark` with a cluster Spark master"),
)
