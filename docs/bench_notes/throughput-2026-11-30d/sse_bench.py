import json, time, statistics, sys
from kvgate.middleware.forward.relay_events import SseParser
base = {"id": "chatcmpl-0123456789ab", "object": "chat.completion.chunk", "created": 1700000000, "model": "fake"}
words = ("Answer 12: tp-all_miss q123: amber basalt cinder delta ember fjord garnet harbor indigo juniper kelp lagoon meadow nectar").split()
ev = [f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}, 'finish_reason': None}]})}\n\n"]
for w in words:
    ev.append(f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {'content': w + ' '}, 'finish_reason': None}]})}\n\n")
ev.append(f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}]})}\n\n")
ev.append(f"data: {json.dumps({**base, 'choices': [], 'usage': {'prompt_tokens': 400, 'completion_tokens': 16, 'total_tokens': 416}})}\n\n")
ev.append("data: [DONE]\n\n")
evb = [e.encode() for e in ev]
whole = b"".join(evb)
def one_read():
    p = SseParser(True); p.feed(whole); return p
def per_event():
    p = SseParser(True)
    for e in evb: p.feed(e)
    return p
p = one_read(); assert p.resume.sent_text.startswith("Answer 12"), p.resume.sent_text
for fn in (one_read, per_event):
    xs = []
    for _ in range(15):
        a = time.process_time()
        for _ in range(2000): fn()
        xs.append((time.process_time() - a) / 2000 * 1e6)
    print(sys.argv[1] if len(sys.argv) > 1 else "", fn.__name__, len(evb), "events", round(min(xs), 1), "us/stream")
