"""A vLLM-like fake engine: 16 streamed tokens per answer, usage at the end."""
import json, sys, time, uuid, asyncio
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
import uvicorn
app = FastAPI()
GAP = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
@app.get("/v1/models")
async def models():
    return {"object": "list", "data": [{"id": "smol", "object": "model", "owned_by": "x"}]}
@app.get("/health")
async def health():
    return {"status": "ok"}
@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    n = int(body.get("max_tokens") or 16)
    words = [f"w{i} " for i in range(n)]
    rid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": body.get("model")}
    async def events():
        yield f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}, 'finish_reason': None}]})}\n\n"
        for w in words:
            if GAP: await asyncio.sleep(GAP)
            yield f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {'content': w}, 'finish_reason': None}]})}\n\n"
        yield f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'length'}]})}\n\n"
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': {'prompt_tokens': 100, 'completion_tokens': n, 'total_tokens': 100 + n, 'prompt_tokens_details': {'cached_tokens': 0}}})}\n\n"
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
