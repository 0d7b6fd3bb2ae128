from plugins.scorers import kv_cache, queue_depth, running_requests, token_load  # noqa: F401
