"""spark-submit entry points. Each module has main(argv) returning a small result; spark-submit runs the file."""
