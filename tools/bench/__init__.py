"""Benchmark harnesses behind `kvgate bench`, and the process/server helpers they (and the tests) use."""
