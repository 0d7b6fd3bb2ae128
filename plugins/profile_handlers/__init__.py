from plugins.profile_handlers import single  # noqa: F401
