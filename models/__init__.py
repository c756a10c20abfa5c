"""recflow model packages: each has model.py, data.py (loader), train.py / evaluate.py entry points (main(argv))."""
