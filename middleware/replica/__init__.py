"""Engine replicas behind kvgate: `sim` (a simulated replica that models an engine's prefix (KV)
cache and timing, for routing benchmarks) and, later, the reference CPU replica."""
