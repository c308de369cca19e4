"""What kvgate reports about itself: Prometheus metrics, scrape-time collectors, the dashboard's
samples, replicas' own /metrics and the event loop's lag.

May import: index/, the shared core, kvgate.middleware.routing and kvgate.middleware.engines (it reads their
state); never cache/, forward/, the pipeline or a face.
"""
