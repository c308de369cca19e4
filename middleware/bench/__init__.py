"""Benchmark harnesses behind `kvgate bench`, and the fake backend they (and the tests) use."""
