"""The proxy process: the ASGI app and its handlers (chat completions in plain ASGI, the rest on
FastAPI), auth, admission, input checks, the admin API (replicas; erasing tenants and invalidating
tags: governance.py), the dashboard, `serve --workers` and the process's CPU slice (cpu_slice.py).

May import: everything in middleware/ below the CLI (it builds its pipeline with kvgate.middleware.build);
handlers stay thin: parse, call the pipeline, map errors (kvgate.middleware.errors).
"""
