"""Every built-in plugin, one folder per kind; importing this registers them all.

Find a plugin by its YAML type: `grep -rn 'register("TYPE"' plugins/`.
"""

from plugins import (  # noqa: F401
    datalayer,
    deciders,
    filters,
    pickers,
    prefix,
    profile_handlers,
    scorers,
)
