"""Benchmark of this project's dedup flows against baselines, on the local servers.

Run `./dev bench` (or `.venv/bin/python -m benchmarks --help`). Results go to
benchmarks/out/ (git-ignored): results.md, results.json, chart.png.
"""
