from plugins.datalayer import sources  # noqa: F401
