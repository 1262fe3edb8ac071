"""Sliding-window quotas: the engine and its Lua script, where limits come from
(settings, live overrides) and the admin that changes them.
"""
