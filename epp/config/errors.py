"""A configuration error names the file, the path of the field and the fix."""

from __future__ import annotations


class ConfigError(ValueError):
    def __init__(self, path: str, message: str, source: str = "") -> None:
        self.path = path
        self.message = message
        self.source = source
        super().__init__(self._text())

    def _text(self) -> str:
        where = f"{self.source}: " if self.source else ""
        at = f"{self.path}: " if self.path else ""
        return f"{where}{at}{self.message}"

    def in_file(self, source: str) -> ConfigError:
        return ConfigError(self.path, self.message, source)
