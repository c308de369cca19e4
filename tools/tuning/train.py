"""Fine-tune the packaged MiniLM as a cross-encoder verifier and export it to ONNX.

The cross-encoder reads "[CLS] cached question [SEP] new question [SEP]" and outputs one logit:
does the new question ask the same thing? Starting from all-MiniLM-L6-v2 (already good at
sentence similarity) it learns, from the labelled pairs plus synthetic hard negatives
(kvgate.tools.tuning.synthetic), the differences the embedding glosses over.

Reproducible: fixed seeds, one thread pool of `threads`, examples ordered by a hash, so the same
inputs and config give the same artefact on the same machine. Everything is local: the base
weights are the packaged MiniLM, nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from kvgate.middleware.progress import Progress
from kvgate.tools.tuning.synthetic import hard_negatives, symmetric_positives

Example = tuple[str, str, float]  # (cached question, new question, label 1 = same question)
ARTEFACT_VERSION = 1


@dataclass(frozen=True)
class TrainConfig:
    """What `kvgate tune` trains with; the defaults fit `make install` on 2 CPU cores."""

    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 4e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_length: int = 64  # tokens for both questions; Quora pairs are ~30
    negatives_per_question: int = 1  # synthetic hard negatives made from each training question
    synthetic_fraction: float = 0.35  # share of training questions used as synthetic-negative sources
    layers: int = 6  # encoder layers kept from MiniLM (6 = all); fewer = faster, weaker
    freeze_embeddings: bool = True  # the word-embedding table is half the weights: frozen, a step is much cheaper
    max_examples: int | None = None  # cap (tests / quick runs)
    seed: int = 13
    threads: int = 2

    def fingerprint(self, data_digest: str, base: Path) -> str:
        """Names the artefact after everything that shapes it (config, data, base weights)."""
        weights = base / "model.safetensors"
        size = weights.stat().st_size if weights.exists() else 0
        shaping = {k: v for k, v in asdict(self).items() if k != "threads"}  # threads change speed, not the model
        raw = json.dumps({"cfg": shaping, "data": data_digest, "base": size, "v": ARTEFACT_VERSION}, sort_keys=True)
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _order_key(text: str, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}\0{text}".encode()).digest()


def build_examples(
    labelled: Sequence[tuple[str, str, bool]], positives: Sequence[tuple[str, str]], cfg: TrainConfig
) -> list[Example]:
    """Training examples: the labelled pairs, extra positive pairs, synthetic hard negatives.

    Invariant: every text in the result comes from `labelled` / `positives` or is an edit of one
    (no other data). Pair order (which side is "cached") is set by a hash so both orders occur;
    the list is ordered by a hash of its content, hence deterministic.
    """
    out: list[Example] = []
    for a, b, dup in labelled:
        flip = _order_key(a + b, cfg.seed)[0] & 1
        out.append((b, a, float(dup)) if flip else (a, b, float(dup)))
    for a, b in positives:
        out.append((a, b, 1.0))
    sources = sorted({q for a, b, _ in labelled for q in (a, b)})
    cut = int(cfg.synthetic_fraction * 256)
    chosen = [q for q in sources if _order_key(q, cfg.seed + 1)[0] < cut]
    for q, edited, _kind in hard_negatives(chosen, cfg.negatives_per_question):
        out.append((q, edited, 0.0))
        out.append((edited, q, 0.0)) if _order_key(edited, cfg.seed)[0] & 1 else None
    for q, swapped in symmetric_positives(sources):
        out.append((q, swapped, 1.0))
    out.sort(key=lambda e: _order_key(e[0] + "\0" + e[1], cfg.seed))
    return out[: cfg.max_examples] if cfg.max_examples else out


def _batches(examples: Sequence[Example], cfg: TrainConfig, epoch: int) -> list[list[int]]:
    """A deterministic order per epoch; within windows of 32 batches, examples of similar length
    share a batch (less padding, so less compute), then the batches themselves are shuffled."""
    order = sorted(range(len(examples)), key=lambda i: _order_key(f"{epoch}:{i}", cfg.seed))
    window = cfg.batch_size * 32
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(examples[i][0]) + len(examples[i][1]))
        batches += [chunk[j : j + cfg.batch_size] for j in range(0, len(chunk), cfg.batch_size)]
    return sorted(batches, key=lambda b: _order_key(f"{epoch}:b:{b[0]}", cfg.seed))


def optimizer_step(loss, model, optim, sched) -> float:  # type: ignore[no-untyped-def]
    """One training step on `loss` (gradients clipped to norm 1, then the schedule advances);
    returns the loss as a float. Shared by the verifier's and the embedder's training loops."""
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    sched.step()
    optim.zero_grad(set_to_none=True)
    return float(loss.detach())


def train_cross_encoder(
    examples: Sequence[Example], base: Path, cfg: TrainConfig, device: str = "cpu"
):  # -> (model, tokenizer); torch types are not imported at module level
    """Fine-tune MiniLM (first `cfg.layers` layers) with one logit and BCE loss; returns the model in eval mode."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    tok = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(base), num_labels=1, num_hidden_layers=cfg.layers, attn_implementation="eager", local_files_only=True
    ).to(device)
    if cfg.freeze_embeddings:
        for param in model.base_model.embeddings.word_embeddings.parameters():
            param.requires_grad = False
    model.train()
    total = sum(len(_batches(examples, cfg, e)) for e in range(cfg.epochs))
    no_decay = ("bias", "LayerNorm.weight")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in trainable if not any(k in n for k in no_decay)], "weight_decay": cfg.weight_decay},
        {"params": [p for n, p in trainable if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    optim = torch.optim.AdamW(groups, lr=cfg.learning_rate)
    sched = get_linear_schedule_with_warmup(optim, int(cfg.warmup_fraction * total), total)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    step = 0
    bar = Progress(total, "training the verifier", unit="batches", every_s=30)
    for epoch in range(cfg.epochs):
        running = 0.0
        for batch_ids in _batches(examples, cfg, epoch):
            batch = [examples[i] for i in batch_ids]
            enc = tok(
                [a for a, _, _ in batch],
                [b for _, b, _ in batch],
                padding=True,
                truncation=True,
                max_length=cfg.max_length,
                return_tensors="pt",
            ).to(device)
            labels = torch.tensor([y for _, _, y in batch], dtype=torch.float32, device=device)
            logits = model(**enc).logits.squeeze(-1)
            running += optimizer_step(loss_fn(logits, labels), model, optim, sched)
            step += 1
            if step % 50 == 0:
                bar.update(50, note=f"epoch {epoch + 1}/{cfg.epochs} loss {running / 50:.4f}")
                running = 0.0
    bar.update(step % 50)
    bar.close()
    model.eval()
    return model.to("cpu"), tok


def export_verifier(model, tok, target: Path, meta: dict) -> Path:  # type: ignore[no-untyped-def]
    """Write model.onnx (input ids, mask, type ids → probability), the tokenizer and meta.json into
    `target`, atomically: built in a sibling temp dir, then renamed into place."""
    import torch

    class _Prob(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            logits = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).logits
            return torch.sigmoid(logits.squeeze(-1))

    names = ("input_ids", "attention_mask", "token_type_ids")
    tmp = target.parent / f".{target.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    sample = tok(
        ["how do I lose weight", "a question"],
        ["how to lose weight fast", "another"],
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        torch.onnx.export(
            _Prob(model.eval()),
            tuple(sample[k] for k in names),
            str(tmp / "model.onnx"),
            input_names=list(names),
            output_names=["probability"],
            dynamic_axes={k: {0: "batch", 1: "tokens"} for k in names} | {"probability": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    tok.save_pretrained(str(tmp))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target
