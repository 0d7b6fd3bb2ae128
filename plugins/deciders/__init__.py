"""P/D deciders: given the chosen decode endpoint, does this request need a remote prefill?

The `disagg-profile-handler` names one by its plugin name (`deciders: {prefill: NAME}`).
"""
