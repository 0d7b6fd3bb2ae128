from plugins.pickers import max_score, random_picker, weighted_random  # noqa: F401
