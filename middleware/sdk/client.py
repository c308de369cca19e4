"""The Python SDK: `Gateway(config).completion(**litellm_kwargs)`.

Same kwargs as `litellm.completion`; returns litellm's objects. How the call was served is on
every response and stream chunk as `response._hidden_params["kvgate"]` (a CacheInfo; also via
`cache_info(response)`), and on stream wrappers as `.kvgate`. `cache={...}` takes LiteLLM's
per-call names: "no-cache", "no-store", "ttl", and "namespace" (the tenant for this call).
`gateway.feedback(cache_info(response).request_id, correct=False)` reports a wrong answer.
`cache_tags=["doc:123@v4"]` tags the answer a call stores; `gateway.invalidate(["doc:123@v4"])`
removes every answer tagged so, `gateway.erase_tenant(tenant)` everything of one tenant
(kvgate.middleware.cache.governance; a remote proxy's admin API: kvgate.middleware.sdk.admin_client).
`completion` is the async flow run on the pipeline's own loop thread (kvgate.middleware.sync_adapter),
so sync and async calls take the same path, and sync calls from many threads run concurrently.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

from kvgate.index.responses.tags import system_tag  # noqa: F401  (public here: the tag a system prompt gets)
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cache.feedback import FeedbackOutcome
from kvgate.middleware.cache.governance import Governance, Invalidated, TenantErased
from kvgate.middleware.config import Config, load_config, parse_config
from kvgate.middleware.pipeline import CacheInfo, Pipeline, Result
from kvgate.middleware.request import CacheControl
from kvgate.middleware.tags import parse_tags


def cache_info(response: Any) -> CacheInfo | None:
    """The CacheInfo of a response, chunk or stream returned by a Gateway."""
    info = getattr(response, "kvgate", None)
    if isinstance(info, CacheInfo):
        return info
    hidden = getattr(response, "_hidden_params", None)
    if isinstance(hidden, dict):
        return hidden.get("kvgate")
    return getattr(hidden, "kvgate", None)  # text completions: LiteLLM's HiddenParams model


class _Served:
    """What a stream wrapper knows: how the call was served (`.kvgate`) and its chunks."""

    def __init__(self, result: Result) -> None:
        self.kvgate = result.info
        self._chunks = result.stream


class Stream(_Served):
    """Sync stream of litellm chunks; `.kvgate` says how it was served. `close()` (or dropping
    it) before the end cancels the backend stream, and the unfinished answer is not stored."""

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks.close()


class AsyncStream(_Served):
    """Async stream of litellm chunks; `.kvgate` says how it was served."""

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        await self._chunks.aclose()


class Gateway:
    """kvgate in-process. One Gateway per cache dir and process; thread-safe."""

    def __init__(
        self, config: str | Path | Config | dict[str, Any], *, tenant: str = "default", pipeline: Pipeline | None = None
    ) -> None:
        if isinstance(config, (str, Path)):
            config = load_config(config)
        elif isinstance(config, dict):
            config = parse_config(config)
        self.config = config
        self.tenant = tenant
        self.pipeline = pipeline or build_pipeline(config)

    def _split(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], str, CacheControl]:
        cache = kwargs.pop("cache", None)
        control = CacheControl.from_kwarg(cache)
        tags = kwargs.pop("cache_tags", None)
        if tags is not None:
            control = replace(control, tags=parse_tags(tags, param="cache_tags"))
        tenant = str(cache.get("namespace")) if isinstance(cache, dict) and cache.get("namespace") else self.tenant
        return kwargs, tenant, control

    def completion(self, **kwargs: Any) -> Any:
        """Like `litellm.completion`: a ModelResponse, or a Stream of chunks when stream=True."""
        result = self.pipeline.complete(*self._split(kwargs))
        return Stream(result) if result.stream is not None else result.response

    async def acompletion(self, **kwargs: Any) -> Any:
        """Like `litellm.acompletion`: a ModelResponse, or an AsyncStream when stream=True."""
        result = await self.pipeline.acomplete(*self._split(kwargs))
        return AsyncStream(result) if result.stream is not None else result.response

    def text_completion(self, **kwargs: Any) -> Any:
        """Like `litellm.text_completion` (one prompt: a string or a list of token ids): a
        TextCompletionResponse, or a Stream of chunks when stream=True."""
        result = self.pipeline.complete(*self._split(kwargs), endpoint="completions")
        return Stream(result) if result.stream is not None else result.response

    async def atext_completion(self, **kwargs: Any) -> Any:
        """Like `litellm.atext_completion`."""
        result = await self.pipeline.acomplete(*self._split(kwargs), endpoint="completions")
        return AsyncStream(result) if result.stream is not None else result.response

    def feedback(self, request_id: str, correct: bool, *, namespace: str | None = None) -> FeedbackOutcome:
        """Judge an answer by its `cache_info(response).request_id`; `correct=False` removes the
        entry and tightens its neighbourhood. Raises RequestNotFound for another tenant's id."""
        return self.pipeline.feedback(request_id, correct, namespace or self.tenant)

    def invalidate(self, tags: list[str], *, tenant: str | None = None, sweep: bool = False) -> Invalidated:
        """Delete every stored answer tagged with any of `tags` (a client's tag, `system_tag(...)`,
        `model:<revision>`): every tenant's, or only `tenant`'s. Blocking (a pass over the matches)."""
        governance = self._governance()
        return governance.invalidate(parse_tags(tags, param="tags", client=False), tenant, sweep)

    def erase_tenant(self, tenant: str) -> TenantErased:
        """Remove everything of `tenant` (a Gateway's tenant or a `cache={"namespace": ...}`): its
        answers, vectors, feedback marks and request ids, and give it a new salt epoch so no
        engine or KV tier matches what it cached. Blocking (a pass over the stores)."""
        return self._governance().erase_tenant(tenant)

    def _governance(self) -> Governance:
        if self.pipeline.governance is None:
            raise RuntimeError("this Gateway's pipeline was built without governance")
        return self.pipeline.governance

    async def afeedback(self, request_id: str, correct: bool, *, namespace: str | None = None) -> FeedbackOutcome:
        """Async `feedback` (the disk work runs in a thread)."""
        return await asyncio.to_thread(self.feedback, request_id, correct, namespace=namespace)

    def close(self) -> None:
        self.pipeline.close()

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
