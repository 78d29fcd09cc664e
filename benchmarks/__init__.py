"""Benchmarks of ctlwire against baselines measured in the same run (``ctlwire bench``)."""
