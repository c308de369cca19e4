"""Chat rendering shared by the chat tokenizers: the messages a template sees and how a rendered
prompt is cut into segments; and, for the tokenizer without transformers (tokenizer_light.py),
chat templates found and rendered as transformers does, on jinja2 alone.

vLLM renders prompts with transformers' `apply_chat_template`, so a router without transformers
(the core install) repeats what that does on load and on render:

- The template: `chat_template.jinja` and `additional_chat_templates/*.jinja` (by name) beside the
  tokenizer take priority over the config's `chat_template` (a string, or a list of {name,
  template}); of several, the one named "default". A processor's `chat_template.json` is read
  last, where nothing else names one (some models keep theirs only there).
- The environment: an immutable sandbox, trim_blocks and lstrip_blocks, loopcontrols, the
  `{% generation %}` block (transformers marks assistant text with it; it renders as its body),
  a `tojson` that does not escape HTML (json.dumps and its arguments), `raise_exception`,
  `strftime_now`, and `dict` and `namespace` that cannot reach private attributes.
- The variables: the messages (a key whose value is None dropped), add_generation_prompt, tools
  and documents None, and the named special tokens (bos_token, eos_token, ...).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
PROCESSOR_FILE = "chat_template.json"


def content_text(content: Any) -> str:
    """A message's content as the text the chat renderings use (text parts joined by newlines)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def chat_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a model's chat template sees them: role and content text only."""
    return [{"role": m.get("role", "user"), "content": content_text(m.get("content"))} for m in messages]


def boundary_token(special_tokens: Sequence[str]) -> str | None:
    """The special token segments start with: the longest one naming a start (`<|im_start|>`),
    else the longest one; None without any."""
    specials = sorted((t for t in special_tokens if t), key=len, reverse=True)
    return next((t for t in specials if "start" in t), specials[0] if specials else None)


def split_segments(text: str, boundary: str | None) -> list[str]:
    """`text` cut before each `boundary`, which starts the next segment; no empty segment."""
    if not boundary:
        return [text]
    # str.split, not a lookahead regex: the same segments, far faster on long prompts
    head, *rest = text.split(boundary)
    return ([head] if head else []) + [boundary + part for part in rest]


def find_chat_template(directory: Path, config: dict[str, Any]) -> tuple[str | None, str]:
    """(the template transformers would pick, or None; why there is none)."""
    templates: dict[str, str] = {}
    if (directory / TEMPLATE_FILE).is_file():
        templates["default"] = (directory / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (directory / TEMPLATE_DIR).is_dir():
        for file in sorted((directory / TEMPLATE_DIR).glob("*.jinja")):
            templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    configured: Any = config.get("chat_template")
    if templates:
        configured = templates["default"] if list(templates) == ["default"] else templates
    elif isinstance(configured, list):
        configured = {t["name"]: t["template"] for t in configured}
    elif configured is None and (directory / PROCESSOR_FILE).is_file():
        configured = json.loads((directory / PROCESSOR_FILE).read_text(encoding="utf-8")).get("chat_template")
    if isinstance(configured, dict):
        if "default" in configured:
            return configured["default"], ""
        return None, f"{directory} has several chat templates and none named 'default': {sorted(configured)}"
    if isinstance(configured, str):
        return configured, ""
    return None, f"{directory} has no chat template"


def compile_template(source: str) -> Any:
    """The template, compiled in an environment like transformers' (render it with render_chat)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: its body, as rendered (no tracking wanted)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's own signature: `namespace(self=...)` works
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(), namespace=TemplateNamespace
    )
    return env.from_string(source)


def render_chat(
    template: Any,
    messages: Sequence[dict[str, Any]],
    special_tokens: dict[str, str],
    add_generation_prompt: bool = True,
) -> str:
    """A compiled template (compile_template) rendered with the variables transformers passes."""
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
    return template.render(
        **special_tokens, messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt
    )
