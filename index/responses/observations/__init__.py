"""Verified outcomes of semantic hits (`semantic.max_error_rate`): the ObservationStore protocol
(base.py) and its implementations, one per file (disk.py)."""
