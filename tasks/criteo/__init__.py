"""Criteo click logs: schema, raw-row validation, ingest, preprocessing into split-binary, the DLRM pipeline steps,
and the synthetic day generator."""
