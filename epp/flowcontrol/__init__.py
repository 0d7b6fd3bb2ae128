"""Flow control: requests that may wait are held in the EPP while the pool is saturated.

GIE's flow-control layer (gie-epp.md §5.4, `pkg/epp/flowcontrol/`), in three rooms:
`config.py` the `flowControl:` section and its policy plugins' choices, `queue.py` the
pure priority-band / fairness / capacity structure, `controller.py` the asyncio side
(futures, TTL timers, dispatch as capacity frees), `metrics.py` GIE's metric names.
"""
