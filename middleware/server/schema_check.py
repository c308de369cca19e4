"""A fast first check of a chat request's body: the pydantic schema (kvgate.middleware.server.schema)
restated as msgspec Structs, which check a parsed body in a few microseconds.

The pydantic model stays the one definition of what is accepted and of what a refusal says: a
body this check passes is one the model passes too, and any body this check refuses is handed
to the model, which accepts it (this check is stricter in a few corners: integers past 64 bits)
or refuses it with its own message. So the check may only ever be stricter than the model, never
looser. tests/test_schema_check.py holds it to that on generated bodies, and to declaring every
field the model declares, so a field added to one and not the other fails there.

Why a second statement of the schema: pydantic's validator is a large native library entered
once per request, and on the request path its code and tables are cold every time; msgspec
already parses the body (kvgate.middleware.server.body), so its checks run warm.

May import: the standard library, msgspec, pydantic (the model a body is checked for) and
kvgate.middleware.server.schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct
from pydantic import BaseModel

from kvgate.middleware.server.schema import ChatCompletionRequest

NonEmpty = Annotated[str, Meta(min_length=1)]


class FunctionDef(Struct):
    name: NonEmpty
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(Struct):
    type: Literal["function"]
    function: FunctionDef


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class NamedFunction(Struct):
    name: NonEmpty


class NamedToolChoice(Struct):
    type: Literal["function"]
    function: NamedFunction


class ContentPart(Struct):
    type: NonEmpty
    text: str | None = None

    def __post_init__(self) -> None:
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs a string `text`")


class ChatMessage(Struct):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | Annotated[list[ContentPart], Meta(min_length=1)] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


Penalty = Annotated[float, Meta(ge=-2, le=2)]
MaxTokens = Annotated[int, Meta(ge=1, le=1_000_000)]


class ChatRequest(Struct):
    model: NonEmpty
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    n: Annotated[int, Meta(ge=1, le=16)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    user: str | None = None
    stream_options: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: dict[str, Any] | None = None


# each pydantic model with a restatement here, and its restatement
STRUCTS: dict[type[BaseModel], type[Struct]] = {ChatCompletionRequest: ChatRequest}


def passes(body: dict[str, Any], schema: type[BaseModel]) -> bool:
    """Whether `body` (parsed JSON) surely passes `schema`: True only if it does; False when it may
    not, or when `schema` has no restatement here (the caller then asks pydantic)."""
    struct = STRUCTS.get(schema)
    if struct is None:
        return False
    try:
        msgspec.convert(body, struct)
    except (msgspec.ValidationError, ValueError, TypeError):
        return False
    return True
