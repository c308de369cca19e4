"""Fine-tune the embedder (a sentence-transformers bi-encoder) on labelled pairs, within a budget.

Two losses per batch of labelled pairs:
* multiple-negatives ranking on the batch's duplicate pairs: each question must be nearer its own
  duplicate than every other question of the batch (cheap negatives, the bulk of the signal);
* online contrastive on all the batch's pairs: only the hard ones count — duplicates farther apart
  than the closest non-duplicate, non-duplicates nearer than the farthest duplicate, pushed past
  a margin. QQP's non-duplicates are hard negatives (same topic, other question), which is where
  a general-purpose embedder puts different questions too close.

Bounded: the loop stops at `max_minutes` of wall clock (checked per step) or after `epochs`,
whichever comes first; torch runs on `threads` threads. Deterministic order (hash-sorted batches,
fixed seeds); everything local (the base is the packaged MiniLM, nothing is downloaded).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from kvgate.middleware.progress import Progress
from kvgate.tools.tuning.train import optimizer_step

Row = tuple[str, str, bool]  # (question1, question2, duplicate?)


@dataclass(frozen=True)
class EmbedderTrainConfig:
    """What `kvgate tune --embedder` trains with; the defaults fit 2 CPU cores and `qqp_dev.csv`."""

    epochs: int = 2
    batch_size: int = 32
    learning_rate: float = 3e-5
    warmup_fraction: float = 0.1
    max_length: int = 64  # tokens per question; Quora questions are ~15
    scale: float = 20.0  # multiple-negatives ranking: cosine × scale are the logits
    margin: float = 0.5  # online contrastive: non-duplicates pushed to cosine distance ≥ margin
    max_minutes: float = 12.0
    max_steps: int | None = None  # tests / quick runs
    seed: int = 13
    threads: int = 2


def _key(text: str, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}\0{text}".encode()).digest()


def batches(rows: Sequence[Row], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Row indices in batches, a deterministic order per epoch.

    Invariant: every row is in exactly one batch of each epoch; the order depends only on the
    rows' texts, the seed and the epoch."""
    order = sorted(range(len(rows)), key=lambda i: _key(f"{epoch}\0{rows[i][0]}\0{rows[i][1]}", seed))
    return [order[j : j + batch_size] for j in range(0, len(order), batch_size)]


def train_embedder(
    rows: Sequence[Row], base: Path, cfg: EmbedderTrainConfig, log: Callable[[str], None] = lambda _m: None
) -> tuple[Any, dict[str, Any]]:
    """Fine-tune the sentence-transformers model at `base` on `rows`; returns (model, facts:
    steps, epochs run, whether the budget stopped it, seconds)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    model.max_seq_length = cfg.max_length
    model.train()
    per_epoch = [batches(rows, cfg.batch_size, cfg.seed, e) for e in range(cfg.epochs)]
    total = sum(len(b) for b in per_epoch)
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    optim = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate, weight_decay=0.01
    )
    warmup = max(1, int(cfg.warmup_fraction * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup)))
    )
    deadline = time.monotonic() + cfg.max_minutes * 60
    started = time.perf_counter()
    step, stopped_by_budget, running = 0, False, 0.0
    with Progress(total, "training the embedder", unit="batches", every_s=30) as bar:
        for epoch_batches in per_epoch:
            for ids in epoch_batches:
                if step >= total:
                    break
                if time.monotonic() >= deadline:
                    stopped_by_budget = True
                    break
                running += optimizer_step(_loss(model, [rows[i] for i in ids], cfg), model, optim, sched)
                step += 1
                if step % 10 == 0:
                    bar.update(10, note=f"loss {running / 10:.4f}")
                    running = 0.0
            if stopped_by_budget or step >= total:
                break
        bar.update(step % 10)
    if stopped_by_budget:
        log(f"stopped by the time budget ({cfg.max_minutes} min) after {step} of {total} batches")
    model.eval()
    return model, {
        "steps": step,
        "planned_steps": total,
        "stopped_by_budget": stopped_by_budget,
        "train_seconds": round(time.perf_counter() - started, 1),
    }


def _embed(model: Any, texts: list[str]) -> Any:
    import torch

    features = (getattr(model, "preprocess", None) or model.tokenize)(texts)
    out = model(features)["sentence_embedding"]
    return torch.nn.functional.normalize(out, dim=-1)


def _loss(model: Any, batch: list[Row], cfg: EmbedderTrainConfig) -> Any:
    """Multiple-negatives ranking over the duplicates + online contrastive over all pairs."""
    import torch

    a = _embed(model, [r[0] for r in batch])
    b = _embed(model, [r[1] for r in batch])
    labels = torch.tensor([r[2] for r in batch], dtype=torch.bool)
    total = a.new_zeros(())
    pos = labels.nonzero().squeeze(-1)
    if len(pos) > 1:
        scores = a[pos] @ b[pos].T * cfg.scale
        target = torch.arange(len(pos))
        total = (
            total
            + (torch.nn.functional.cross_entropy(scores, target) + torch.nn.functional.cross_entropy(scores.T, target))
            / 2
        )
    distance = 1 - (a * b).sum(-1)
    if labels.any() and (~labels).any():
        hard_pos = distance[labels][distance[labels] > distance[~labels].min()]
        hard_neg = distance[~labels][distance[~labels] < distance[labels].max()]
        total = (
            total
            + hard_pos.pow(2).sum() / len(batch)
            + torch.nn.functional.relu(cfg.margin - hard_neg).pow(2).sum() / len(batch)
        )
    return total


def pair_cosines(embed: Callable[[list[str]], np.ndarray], rows: Sequence[Row]) -> np.ndarray:
    """Cosine of each pair's two questions (rows are unit vectors, so the dot product)."""
    if not rows:
        return np.zeros(0, dtype=np.float32)
    a = embed([r[0] for r in rows])
    b = embed([r[1] for r in rows])
    return (a * b).sum(axis=1)


def precision_at_recall(scores: np.ndarray, labels: np.ndarray, recall: float) -> tuple[float | None, float | None]:
    """(precision, threshold) at the highest threshold t (duplicate when score ≥ t) whose recall
    reaches `recall`; (None, None) without duplicates. Ties are kept together.

    Invariant: the threshold returned is a score of a duplicate; lowering it can only lower
    precision or keep it, never reach the recall sooner."""
    labels = np.asarray(labels, dtype=bool)
    if not labels.any():
        return None, None
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    tp = np.cumsum(y)
    n = np.arange(1, len(y) + 1)
    last_of_tie = np.append(s[1:] != s[:-1], True)
    ok = last_of_tie & (tp >= recall * labels.sum() - 1e-9)
    at = int(np.argmax(ok))
    return float(tp[at] / n[at]), float(s[at])


def scores_at(scores: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, float | None]:
    """Precision and recall of "duplicate when score ≥ threshold"."""
    labels = np.asarray(labels, dtype=bool)
    hit = scores >= threshold
    tp = int((hit & labels).sum())
    return {
        "threshold": threshold,
        "precision": round(tp / int(hit.sum()), 4) if hit.any() else None,
        "recall": round(tp / int(labels.sum()), 4) if labels.any() else None,
    }
