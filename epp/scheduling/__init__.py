"""The scheduling framework: plugin contracts, profiles and the scheduler.

It knows no concrete plugin; those live in `plugins/` and register by YAML type.
"""
