"""`kvgate bench embedders`' scoring (pure) and the mpnet embedder (when its wheels are installed:
`make mpnet`; the default install leaves them out, see README "embedder.model")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.index.responses.mpnet_files import MpnetMissing, part_files
from kvgate.middleware.config import parse_config
from kvgate.tools.bench.embedders import pair_auc, recall_at_precision


def test_auc_and_recall_at_precision_on_known_cases():
    labels = np.array([True, True, False, False])
    assert pair_auc(np.array([0.9, 0.8, 0.3, 0.1]), labels) == 1.0
    assert pair_auc(np.array([0.1, 0.3, 0.8, 0.9]), labels) == 0.0
    assert pair_auc(np.array([0.5, 0.5, 0.5, 0.5]), labels) == 0.5
    scores = np.array([0.99, 0.95, 0.9, 0.85, 0.8])
    ys = np.array([True, True, False, True, False])
    assert recall_at_precision(scores, ys, 1.0) == (2 / 3, 0.95)
    assert recall_at_precision(scores, ys, 0.75) == (1.0, 0.85)
    assert recall_at_precision(scores, np.zeros(5, dtype=bool), 0.9) == (0.0, None)


@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=2, max_size=40))
def test_auc_is_symmetric_under_negation(rows):
    scores = np.array([s for s, _ in rows])
    labels = np.array([y for _, y in rows])
    auc = pair_auc(scores, labels)
    if labels.all() or not labels.any():
        assert np.isnan(auc)
    else:
        assert 0.0 <= auc <= 1.0 and pair_auc(-scores, labels) == pytest.approx(1 - auc)


def test_embedder_model_field_is_checked():
    with pytest.raises(Exception) as err:
        parse_config({"routes": [{"name": "r", "model": "*"}], "embedder": {"model": "bert"}})
    assert "embedder.model" in str(err.value)


def _mpnet_installed() -> bool:
    try:
        part_files()
    except MpnetMissing:
        return False
    return True


@pytest.mark.skipif(not _mpnet_installed(), reason="mpnet wheels not installed (make mpnet)")
def test_mpnet_onnx_matches_sentence_transformers_with_padding():
    from sentence_transformers import SentenceTransformer

    from kvgate.index.responses.embedder import make_embedder

    onnx = make_embedder("onnx", model="mpnet")
    texts = ["What is the capital of France?", "Hi", "How do I learn to play the guitar well as an adult beginner?"]
    reference = SentenceTransformer(str(onnx.model_path), device="cpu").encode(texts, normalize_embeddings=True)
    ours = onnx.embed(texts)  # one padded batch
    assert onnx.dim == 768
    np.testing.assert_allclose(ours, reference, atol=1e-4)
