from plugins.profile_handlers import disagg, single  # noqa: F401
