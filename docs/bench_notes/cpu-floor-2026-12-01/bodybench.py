import time, msgspec, argparse
from kvgate.middleware.server.body import _parse_body
from kvgate.middleware.server.schema import ChatCompletionRequest
from kvgate.middleware.server.input_checks import check_unicode
from kvgate.tools.bench.throughput import Workload, add_arguments
ap = argparse.ArgumentParser(); add_arguments(ap); args = ap.parse_args([])
w = Workload("cpu", args, 1)
raws = [w.body(w.new()) for _ in range(3000)]
def t(name, fn):
    best = 1e9
    for _ in range(5):
        a = time.perf_counter()
        for r in raws: fn(r)
        best = min(best, (time.perf_counter() - a) / len(raws) * 1e6)
    print(f"{best:6.2f} us {name}")
bodies = [msgspec.json.decode(r) for r in raws]
t("_parse_body", lambda r: _parse_body(r, ChatCompletionRequest))
t("msgspec decode", msgspec.json.decode)
it = iter(bodies * 10)
t("model_validate", lambda r: ChatCompletionRequest.model_validate(next(it)))
t("check_unicode", lambda r: check_unicode(None, r))
