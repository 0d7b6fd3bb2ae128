from plugins.filters import label_selector, roles  # noqa: F401
