"""The ONNX export and the sentence-transformers reference give the same unit vectors."""

from __future__ import annotations

import numpy as np

from kvgate.index.responses.embedder import Embedder, make_embedder


def test_onnx_matches_sentence_transformers(embedder):
    reference = make_embedder("sentence-transformers")
    texts = ["What is the capital of France?", "short", "a much longer sentence " * 20, ""]
    a, b = embedder.embed(texts), reference.embed(texts)
    assert a.shape == b.shape == (4, 384)
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-4)
    assert np.abs(a - b).max() < 1e-4
    assert isinstance(embedder, Embedder) and isinstance(reference, Embedder)
    paraphrase, other = embedder.embed(["Tell me the capital city of France", "How do I bake bread?"])
    assert a[0] @ paraphrase > 0.9 > a[0] @ other
