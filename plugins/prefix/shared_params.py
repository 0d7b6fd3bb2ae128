"""Refuse prefix parameters that would be silently ignored.

Older upstream configs put the prefix parameters on the scorer. A prefix scorer
therefore takes its producer's parameter class: with no producer configured, the loader
creates one from the scorer's parameters (`_create_missing_producers`). But when a
producer IS configured, the scorer's parameters would configure nothing; upstream's
lenient decoding dropped them without a word. Here the second of the two plugins to be
built (scorer or producer, whatever their order in the file) raises a ConfigError.

The claims live on the `Handle` that one config load shares between its plugins,
because no plugin sees the others while they are being built (the loader fills
`handle.plugins` only afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epp.config.errors import ConfigError
from epp.scheduling.registry import Handle

_ATTR = "_prefix_param_claims"


@dataclass
class _Claims:
    scorers: list[tuple[str, Any]] = field(default_factory=list)  # params given on scorers
    producers: list[tuple[str, Any]] = field(default_factory=list)


def _claims(handle: Handle, producer_type: str) -> _Claims:
    table: dict[str, _Claims] = handle.__dict__.setdefault(_ATTR, {})
    return table.setdefault(producer_type, _Claims())


def _conflict(scorer: str, producer: str, producer_type: str) -> ConfigError:
    return ConfigError(
        "",
        f"scorer {scorer!r} has parameters that producer {producer!r} ({producer_type}) "
        "would ignore: a prefix scorer's parameters configure its producer only when the "
        "config defines none (and scorers sharing it agree); put them on the producer",
    )


def claim_scorer_params(handle: Handle, producer_type: str, name: str, params: Any) -> None:
    """A scorer with non-default parameters: they must match any configured producer."""
    if params == type(params)():
        return
    claims = _claims(handle, producer_type)
    for producer, p in claims.producers:
        if p != params:
            raise _conflict(name, producer, producer_type)
    claims.scorers.append((name, params))


def claim_producer_params(handle: Handle, producer_type: str, name: str, params: Any) -> None:
    """A producer: any scorer's explicit parameters must be the same as its own.

    The producer the loader creates for a scorer gets that scorer's parameters, so it
    passes; an explicitly configured one with other parameters does not.
    """
    claims = _claims(handle, producer_type)
    for scorer, p in claims.scorers:
        if p != params:
            raise _conflict(scorer, name, producer_type)
    claims.producers.append((name, params))
