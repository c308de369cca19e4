"""vLLM's own benchmark client (`vllm bench serve`) pointed at any OpenAI-compatible URL.

Its console entry is broken on the CPU build, so it runs from the module in vLLM's environment:
the arguments are parsed by its own parser and `vllm.benchmarks.serve.main` is called, which
saves its result JSON (completed and failed requests, TTFT, ...) where we read it back. The
default backend (`vllm`) posts to `/v1/completions`.

`multi_turn_prompts` writes a `custom` dataset (JSONL, one prompt per line) of conversations
rendered as plain text, each turn's prompt beginning with the whole previous one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Sequence

RUNNER = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def run_vllm_bench(
    python: str,
    base_url: str,
    model_dir: str,
    served_name: str,
    args: Sequence[str],
    result_dir: Path,
    timeout: float = 600.0,
) -> dict:
    """Run the client with `args` (dataset and load options) against `base_url`; its result JSON.
    Raises RuntimeError with the client's last output when it fails."""
    result_dir.mkdir(parents=True, exist_ok=True)
    command = [
        python,
        "-c",
        RUNNER,
        "--base-url",
        base_url,
        "--model",
        model_dir,
        "--served-model-name",
        served_name,
        "--tokenizer",
        model_dir,
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        "result.json",
        "--disable-tqdm",
        "--ready-check-timeout-sec",
        "0",
        *args,
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    path = result_dir / "result.json"
    if done.returncode != 0 or not path.exists():
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return json.loads(path.read_text())


def multi_turn_prompts(path: Path, conversations: int, turns: int, output_tokens: int = 8) -> Path:
    """A `custom` dataset: `conversations` x `turns` prompts in turn order, each turn's prompt =
    the previous turn's prompt + its (scripted) answer + the next user line."""
    rows = []
    for c in range(conversations):
        prompt = f"A conversation about town number {c} and its history.\n"
        for t in range(turns):
            prompt += f"User: Tell me fact {t} about the mill, the bridge and the market of town {c}.\nAssistant:"
            rows.append({"prompt": prompt, "output_tokens": output_tokens})
            prompt += f" Fact {t}: the town's mill, bridge and market are older than its church.\n"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
