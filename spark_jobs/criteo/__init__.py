"""Criteo Spark jobs (spark-submit entry points): day stats, dictionary, transform."""
