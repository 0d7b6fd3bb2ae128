from plugins.scorers import (  # noqa: F401
    kv_cache,
    lora_affinity,
    no_hit_lru,
    queue_depth,
    running_requests,
    session_affinity,
    token_load,
)
