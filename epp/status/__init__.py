"""The live status page on the metrics port: `/` (plain HTML and JS, no build step, no
CDN) polling `/status.json` (the pool, recent scheduling decisions with per-scorer
scores, the prefix index, the planner). Everything it reads is bounded and cheap on the
request path: one deque append per routed request (`ring.py`); the JSON is built only
when the page asks (`snapshot.py`)."""
