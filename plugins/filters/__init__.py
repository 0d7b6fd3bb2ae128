from plugins.filters import label_selector, prefix_affinity, roles  # noqa: F401
