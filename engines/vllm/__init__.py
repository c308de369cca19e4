"""The real vLLM engine: starting its OpenAI server on loopback (launch.py, run with vLLM's own
environment) and kvgate's KV connector that runs inside it (kv_connector/). Imports only `index`
and, inside the engine process, `vllm`."""
