"""Bring-your-own-dataset Spark jobs (spark-submit entry points): the CSV -> split-binary transcode."""
