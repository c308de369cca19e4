"""The `kv` section of `kvgate bench scaleout`: `kvgate bench kv-remote` at its defaults (turn 2 on
a second replica from the Redis tier vs cold; the tier's load bandwidth vs a raw pipelined GET),
its `kv` fields lifted to the section's top level."""

from __future__ import annotations

import argparse
from typing import Any

from kvgate.tools.bench import kv_remote


def run(ctx: Any) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    kv_remote.add_arguments(parser)
    args = parser.parse_args([])  # the kv-remote defaults; its own command takes the options
    args.dir = ctx.work
    result = kv_remote.run(args)
    return {**result["kv"], "detail": {k: v for k, v in result.items() if k != "kv"}}
