"""Offline tools around the product: benchmark harnesses (`kvgate bench`), tuning (`kvgate tune`)
and the process/server helpers that benchmarks and tests share.

Tools import the core (`middleware`, `index`) and the engines; nothing in the core or the engines
imports a tool (import-linter contracts in pyproject.toml, checked by `make test`).
"""
