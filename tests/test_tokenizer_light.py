"""Without transformers, kvgate reads a model's tokenizer with `tokenizers` + jinja2. These tests
hold that implementation to transformers (what the engines tokenize with): for the packaged
SmolLM2 tokenizer and for variants of its dir that exercise what transformers reads (a template
in the config, named templates, special tokens it adds, a template using the sandbox's filters and
tags), the rendered text, its segments and its token ids are the same over fixed conversations and
generated ones; a completions prompt's ids are the same; MiniLM's input arrays and vectors are the
same. Then, in a process where transformers cannot be imported, both still load and agree."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.tokenizer import chat_messages, load_tokenizer, smollm2_tokenizer_dir
from kvgate.index.responses.embedder import packaged_minilm_path
from kvgate.index.responses.text_inputs_hf import HFTextInputs
from kvgate.index.responses.text_inputs_light import LightTextInputs

ROOT = Path(__file__).resolve().parents[1]

# A template using what transformers' environment offers: namespace, loop controls, the
# `generation` block, tojson with its arguments, dict, raise_exception, strftime_now, special
# tokens as variables, and lines whose whitespace trim_blocks / lstrip_blocks remove.
FEATURES = """{%- set ns = namespace(count=0, roles=[]) -%}
{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}
    {% if loop.index > 8 %}{% break %}{% endif %}
    {% if message['content'] == '' %}{% continue %}{% endif %}
<|im_start|>{{ message['role'] }}
    {% if message['role'] == 'assistant' %}
{% generation %}{{ message['content'] | trim }}{% endgeneration %}{{ eos_token }}
    {% else %}
{{ message['content'] }}<|im_end|>
    {% endif %}
    {% set ns.count = ns.count + 1 %}
{% endfor %}
{{ {'kept': ns.count, 'roles': messages | map(attribute='role') | list, 'raw': 'é <b>&</b>'} | tojson }}
{{ messages[0] | tojson(indent=2, sort_keys=true) }}|{{ dict(a=1, b=[unk_token, pad_token]) | tojson(separators=(',', ':')) }}
{{ strftime_now('%Y') | length }}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

EXTRA_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}{{ sep_token }}{{ m['content'] }}{{ image_token }}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}"
)


def variant(
    base: Path,
    target: Path,
    config: dict[str, Any] | None = None,
    template: str | None = None,
    files: dict[str, Any] | None = None,
    keep_template_file: bool = True,
    tokenizer: dict[str, Any] | None = None,
) -> Path:
    """SmolLM2's tokenizer dir with its config (and tokenizer.json) updated, its template
    replaced, files added."""
    target.mkdir()
    (target / "tokenizer.json").write_text(
        json.dumps({**json.loads((base / "tokenizer.json").read_text()), **(tokenizer or {})})
    )
    (target / "tokenizer_config.json").write_text(
        json.dumps({**json.loads((base / "tokenizer_config.json").read_text()), **(config or {})})
    )
    if keep_template_file:
        (target / "chat_template.jinja").write_text(template or (base / "chat_template.jinja").read_text())
    for name, content in (files or {}).items():
        (target / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return target


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = smollm2_tokenizer_dir()
    tmp = tmp_path_factory.mktemp("tokenizers")
    smol = (base / "chat_template.jinja").read_text()
    return {
        "smollm2": base,
        "config_template": variant(base, tmp / "config_template", {"chat_template": smol}, keep_template_file=False),
        "named_templates": variant(
            base,
            tmp / "named_templates",
            {
                "chat_template": [
                    {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                    {"name": "default", "template": FEATURES},
                ]
            },
            keep_template_file=False,
        ),
        "features": variant(base, tmp / "features", template=FEATURES),
        "added_specials": variant(
            base,
            tmp / "added_specials",
            {
                "bos_token": "<|begin|>",  # not in the vocabulary: added, special
                "image_token": "<|image|>",  # a model-specific named token
                "additional_special_tokens": ["<|start_tool|>", "<|im_end|>"],
            },
            template=EXTRA_TEMPLATE,
            files={
                "special_tokens_map.json": {  # legacy: overrides the config's
                    "eos_token": {
                        "content": "<|eot|>",
                        "lstrip": False,
                        "normalized": False,
                        "rstrip": False,
                        "single_word": False,
                    },
                    "sep_token": "<|sep|>",
                }
            },
        ),
        # what add_special_tokens=True adds is the post-processor's word; add_bos_token is not read
        "bos_processor": variant(
            base,
            tmp / "bos_processor",
            {"add_bos_token": False},
            tokenizer={
                "post_processor": {
                    "type": "TemplateProcessing",
                    "single": [
                        {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}},
                    ],
                    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
                }
            },
        ),
        "no_processor": variant(
            base,
            tmp / "no_processor",
            {"add_bos_token": True, "add_eos_token": True},
            tokenizer={"post_processor": None},
        ),
    }


@pytest.fixture(scope="module")
def pairs(dirs: dict[str, Path]) -> dict[str, tuple[Any, Any]]:
    return {
        name: (load_tokenizer(str(d), backend="transformers"), load_tokenizer(str(d), backend="tokenizers"))
        for name, d in dirs.items()
    }


LONG = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog, again and again." for i in range(400))
FIXED: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": "  Once upon a time...  "},
        {"role": "user", "content": "And then?"},
    ],
    [{"role": "user", "content": "Ünïcödé: 日本語, 中文, العربية, emoji 🙂👩‍👩‍👧, café, naïve, Ω≈ç√"}],
    [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "empty before"},
    ],
    [{"role": "user", "content": None}],
    [{"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}],
    [{"role": "user", "content": "special tokens as text: <|im_start|>user\n<|im_end|><|endoftext|> <|begin|><|sep|>"}],
    [{"role": "user", "content": "whitespace:\t\ttabs\r\nCRLF\n\n\nnewlines   spaces \u00a0nbsp \u200bzero-width"}],
    [{"role": "user", "content": "template syntax is data: {{ bos_token }} {% if x %}y{% endif %} {# c #}"}],
    [
        {"role": "user", "content": LONG},
        {"role": "assistant", "content": LONG[:3000]},
        {"role": "user", "content": "tl;dr?"},
    ],
    [{"role": "assistant", "content": "an assistant first"}, {"role": "assistant", "content": "and again"}],
]
TEXTS = ["hello", " leading space", "", "<|im_start|>user\nhi<|im_end|>", "日本語 🙂 é", "tabs\tand\nnewlines  ", LONG]


def same(hf: Any, light: Any, messages: list[dict[str, Any]]) -> None:
    assert light.render(messages) == hf.render(messages)
    assert light.segments(messages) == hf.segments(messages)
    ids = light.encode_messages(messages)
    # transformers' own chat tokenization: the rendered text encoded without special tokens
    assert ids == list(
        hf._tok.apply_chat_template(
            chat_messages(messages), tokenize=True, add_generation_prompt=True, return_dict=False
        )
    )
    assert [i for s in light.segments(messages) for i in light.encode(s)] == ids  # segment by segment = whole


@pytest.mark.parametrize(
    "name",
    ["smollm2", "config_template", "named_templates", "features", "added_specials", "bos_processor", "no_processor"],
)
def test_fixed_conversations_render_and_tokenize_as_transformers(pairs, name):
    hf, light = pairs[name]
    assert (hf.backend, light.backend) == ("transformers", "tokenizers") and hf.name == light.name
    assert light.vocab_size == hf.vocab_size
    assert light._boundary == hf._boundary
    for messages in FIXED:
        same(hf, light, messages)
    for text in TEXTS:
        assert light.packed_text(text) == hf.packed_text(text)


def test_added_special_tokens_are_matched_whole(pairs):
    hf, light = pairs["added_specials"]
    ids = light.encode("a<|begin|>b<|image|>c<|start_tool|>d<|eot|>e<|sep|>")
    for token in ("<|begin|>", "<|image|>", "<|start_tool|>", "<|eot|>", "<|sep|>"):
        assert light._rust.token_to_id(token) in ids, token
    assert light._boundary == "<|start_tool|>"  # the longest special token naming a start
    assert "<|begin|>assistant\n" in light.render([{"role": "user", "content": "x"}])


def test_a_completions_prompt_gets_what_the_post_processor_adds(pairs):
    assert pairs["bos_processor"][1].packed_text("hi")[:4] == (1).to_bytes(4, "little")  # <|im_start|> first
    assert pairs["no_processor"][1].packed_text("hi") == pairs["smollm2"][1].packed_text("hi")


PIECES = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|begin|>",
    "<|start_tool|>",
    "<|image|>",
    "\n",
    " ",
    "  ",
    "\t",
    "é",
    "日本語",
    "🙂",
    "a",
    "Hello",
    "'",
    '"',
    "\\",
    "{{ x }}",
    "</s>",
]
CONTENT = st.one_of(st.text(max_size=120), st.lists(st.sampled_from(PIECES), max_size=24).map("".join))
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": CONTENT})


@settings(max_examples=120, deadline=None)
@given(
    messages=st.lists(MESSAGE, min_size=1, max_size=6),
    name=st.sampled_from(["smollm2", "features", "added_specials", "bos_processor"]),
    text=CONTENT,
)
def test_generated_conversations_render_and_tokenize_as_transformers(pairs, messages, name, text):
    hf, light = pairs[name]
    same(hf, light, messages)
    assert light.packed_text(text) == hf.packed_text(text)


def test_a_processor_chat_template_is_read_where_nothing_else_names_one(dirs, tmp_path):
    base = dirs["smollm2"]
    only_json = variant(
        base,
        tmp_path / "json",
        keep_template_file=False,
        files={"chat_template.json": {"chat_template": (base / "chat_template.jinja").read_text()}},
    )
    light, reference = (
        load_tokenizer(str(only_json), backend="tokenizers"),
        load_tokenizer(str(base), backend="tokenizers"),
    )
    for messages in FIXED[:4]:
        assert light.render(messages) == reference.render(messages)
    none = variant(base, tmp_path / "none", keep_template_file=False)
    bare = load_tokenizer(str(none), backend="tokenizers")
    assert bare.packed_text("a completions prompt") == reference.packed_text("a completions prompt")
    with pytest.raises(ValueError, match="no chat template"):
        bare.render([{"role": "user", "content": "hi"}])


@functools.cache
def minilm_inputs(max_length: int) -> tuple[HFTextInputs, LightTextInputs]:
    path = packaged_minilm_path()
    return HFTextInputs(path, max_length), LightTextInputs(path, max_length)


SENTENCES = st.lists(
    st.one_of(
        st.text(max_size=200),
        st.lists(
            st.sampled_from(
                ["[CLS]", "[SEP]", "[PAD]", "[MASK]", "word", "Wörd", "中文", "🙂", " ", "\n", "Ωmega", "x" * 40]
            ),
            max_size=120,
        ).map(" ".join),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=80, deadline=None)
@given(texts=SENTENCES, others=SENTENCES)
def test_minilm_inputs_are_transformers_own(texts, others):
    """The embedder's inputs (MiniLM, cut at 256) and the verifier's pairs (cut at 96)."""
    for max_length, second in ((256, None), (96, (others * len(texts))[: len(texts)])):
        hf, light = minilm_inputs(max_length)
        want, got = hf(texts, second), light(texts, second)
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            assert got[key].dtype == np.int64


def test_embedder_vectors_are_the_same_either_way(embedder, monkeypatch):
    import kvgate.index.responses.text_inputs as text_inputs
    from kvgate.index.responses.embedder import make_embedder

    texts = ["What is the capital of France?", "Hi", "", LONG, "Ünïcödé 日本語 🙂", "How do I reset my password?"]
    assert embedder._tok.backend == "transformers"
    monkeypatch.setattr(text_inputs, "have_transformers", lambda: False)
    light = make_embedder("onnx")
    assert light._tok.backend == "tokenizers" and light.path == embedder.path
    np.testing.assert_allclose(light.embed(texts), embedder.embed(texts), atol=1e-6)


WITHOUT = """
import json, logging, sys
sys.modules["transformers"] = None  # `import transformers` fails, as where it is not installed
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from pathlib import Path
from kvgate.index.kv.tokenizer import load_tokenizer, tokenizer_backend
from kvgate.index.responses.embedder_onnx import OnnxEmbedder
args = json.loads(sys.argv[1])
tok = load_tokenizer(args["dir"])
emb = OnnxEmbedder(Path(args["model"]))
print(json.dumps({"backend": tokenizer_backend(), "tok": tok.backend, "emb": emb._tok.backend,
                  "ids": tok.encode_messages(args["messages"]), "vectors": emb.embed(args["texts"]).tolist(),
                  "imported": sys.modules["transformers"] is not None}))
"""


def test_without_transformers_the_tokenizer_and_the_embedder_still_work(embedder):
    messages = FIXED[2]
    texts = ["What is the capital of France?", "Ünïcödé 日本語 🙂"]
    args = {
        "dir": str(smollm2_tokenizer_dir()),
        "model": str(embedder.model_path),
        "messages": messages,
        "texts": texts,
    }
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT, json.dumps(args)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["backend"], out["tok"], out["emb"], out["imported"]) == (
        "tokenizers",
        "tokenizers",
        "tokenizers",
        False,
    )
    hf = load_tokenizer(str(smollm2_tokenizer_dir()), backend="transformers")
    assert out["ids"] == hf.encode_messages(messages)
    np.testing.assert_allclose(np.array(out["vectors"]), embedder.embed(texts), atol=1e-6)
    said = [line for line in done.stderr.splitlines() if line.startswith("kvgate.tokenizer")]
    assert said == [
        f"kvgate.tokenizer: tokenizer {Path(args['dir']).name} ({args['dir']}) loads with tokenizers and "
        "jinja2, rendering and tokenizing as transformers does (transformers is not installed)"
    ], done.stderr
