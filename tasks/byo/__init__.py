"""Bring your own dataset: a CSV FeatureSpec checked, its CSVs generated (tests, demo) and validated, the byo_dlrm
pipeline steps."""
