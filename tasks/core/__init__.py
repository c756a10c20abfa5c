"""Generic machinery that names no dataset: configuration, storage and manifests, data-root layout, child
processes, spark-submit, downloads, trainer launching, progress lines."""
