"""recflow task functions: plain, typed Python that Airflow tasks call (no scheduler needed)."""
