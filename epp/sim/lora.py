"""LoRA adapters: which exist (served names), and which sit in the `max_loras` GPU slots.

vLLM batches at most `max_loras` distinct adapters in one step; a waiting request whose
adapter would be one too many is skipped until a running adapter drains (V1 scheduler).
Slots are an LRU cache: an adapter that is not resident is loaded into the least
recently used slot not needed by the batch, and that load (from disk or CPU memory)
delays the step it happens in by `lora_load_ms`.

Runtime loading mirrors vLLM's `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (enabled in vLLM by `VLLM_ALLOW_RUNTIME_LORA_UPDATING`): the
same JSON bodies, the same success texts and errors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraAdapter:
    name: str
    id: int  # vLLM's lora_int_id: 1, 2, ... in registration order
    path: str


class LoraError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class LoraRegistry:
    def __init__(self, modules: Iterable[str | tuple[str, str]], max_loras: int) -> None:
        self.max_loras = max_loras
        self.adapters: dict[str, LoraAdapter] = {}
        self._next_id = 1
        self._resident: OrderedDict[str, None] = OrderedDict()
        self.loads = 0
        for module in modules:
            name, path = module if isinstance(module, tuple) else _split(module)
            self._add(name, path)

    def _add(self, name: str, path: str) -> LoraAdapter:
        adapter = LoraAdapter(name, self._next_id, path)
        self._next_id += 1
        self.adapters[name] = adapter
        return adapter

    def __contains__(self, name: object) -> bool:
        return name in self.adapters

    def names(self) -> list[str]:
        return list(self.adapters)

    def id_of(self, name: str | None) -> int | None:
        adapter = self.adapters.get(name) if name else None
        return adapter.id if adapter else None

    @property
    def resident(self) -> list[str]:
        return list(self._resident)

    # -- GPU slots (scheduler side) ------------------------------------------------------

    def activate(self, name: str, in_batch: set[str]) -> bool:
        """Make `name` resident for a step whose batch already uses `in_batch`; True if
        that needed a load. The caller guarantees a free or evictable slot exists."""
        slots = self._resident
        if name in slots:
            slots.move_to_end(name)
            return False
        if len(slots) >= self.max_loras:
            victim = next((n for n in slots if n not in in_batch), None)
            if victim is None:  # cannot happen while the batch respects max_loras
                raise RuntimeError("no LoRA slot can be freed")
            del slots[victim]
        slots[name] = None
        self.loads += 1
        return True

    # -- runtime API (server side) -------------------------------------------------------

    def load(self, name: str, path: str) -> str:
        if name in self.adapters:
            raise LoraError(400, f"The lora adapter '{name}' has already been loaded.")
        self._add(name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: str) -> str:
        if name not in self.adapters:
            raise LoraError(404, f"The lora adapter '{name}' cannot be found.")
        del self.adapters[name]
        self._resident.pop(name, None)
        return f"Success: LoRA adapter '{name}' removed successfully."


def _split(module: str) -> tuple[str, str]:
    """vLLM's `--lora-modules name=path` (a bare name gets a made-up path)."""
    name, _, path = module.partition("=")
    if not name:
        raise ValueError(f"bad LoRA module {module!r}: expected NAME or NAME=PATH")
    return name, path or f"/loras/{name}"
