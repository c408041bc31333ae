"""Keel apps that benchmarks serve (``keel serve --app apps.noop_app:app`` from ``bench/``)."""
