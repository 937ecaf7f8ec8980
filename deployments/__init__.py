"""Model deployments served by faro-serve: plain classes, wrapped by Ray Serve in
``faro_serve.serving.app``. Each has ``predict(payload: bytes) -> dict`` returning the
result and ``processing_ms`` (the replica's own processing time, which the router front
reports to the autoscaler), or ``{"error": ..., "status": 4xx}`` for a bad request.
"""
