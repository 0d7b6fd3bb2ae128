"""Prefix-cache locality: producers that estimate which endpoint holds a request's
prefix, and the data they hand to scorers, filters and P/D deciders.

- `approx_producer` (`approx-prefix-cache-producer`) + `prefix_scorer` (`prefix-scorer`):
  an index of where the EPP sent earlier prompts (`approx_index`);
- `precise_producer` (`precise-prefix-cache-producer`) + `precise_scorer`
  (`precise-prefix-cache-scorer`): an index of what the servers' KV events say they hold
  (`precise_index`, fed by `epp.datalayer.kvevents`);
- `hashing`: the block-hash chain both use; `match_info`: what both write.
"""
