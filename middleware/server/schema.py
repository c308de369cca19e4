"""The request body the proxy accepts, as a pydantic model (also the OpenAPI schema).

Only the fields whose type we can check are declared; other OpenAI fields pass through untouched.
Strict: JSON types must match (`"stream": "false"` is refused, not read as true).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    """A tool the model may call. Checked here because LiteLLM fails on malformed tools before
    the backend sees them, which would surface as a backend error instead of the caller's."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"]
    function: FunctionDef


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"]
    function: NamedFunction


class ContentPart(BaseModel):
    """One part of a list content: text checked, other kinds (image_url, input_audio, file) passed on."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str = Field(min_length=1)
    text: str | None = None

    @model_validator(mode="after")
    def _text_has_text(self) -> "ContentPart":
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs a string `text`")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | Annotated[list[ContentPart], Field(min_length=1)] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    n: int | None = Field(None, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(BaseModel):
    """`POST /v1/completions` (vLLM's and OpenAI's shape): a prompt as text, token ids, or a batch
    of either. Fields not declared here go to the engine as they are."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    # checked by the pipeline (kvgate.middleware.request.text_prompt), whose errors name the prompt's place
    prompt: Any = Field(
        json_schema_extra={
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            ]
        }
    )
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    n: int | None = Field(None, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None
    stream_options: dict[str, Any] | None = None


class FeedbackRequest(BaseModel):
    """Body of `POST /v1/cache/feedback`: was the answer to this request right?"""

    model_config = ConfigDict(extra="forbid", strict=True)
    request_id: str = Field(min_length=1, max_length=200, description="the x-kvgate-request-id of the response")
    correct: bool = Field(description="false removes the entry and tightens its neighbourhood")


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.rsplit("/", 1)[1]], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def chat_openapi_extra(model: type[BaseModel] = ChatCompletionRequest) -> dict[str, Any]:
    """A completions operation's request body for the OpenAPI document, self-contained (no $refs):
    the handler reads the raw body itself (size limit, our own error messages), so FastAPI
    cannot derive it. Schemathesis fuzzes the proxy from this document."""
    schema = model.model_json_schema()
    body = _inline(schema, schema.get("$defs", {}))
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}
