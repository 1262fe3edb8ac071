"""Test support: real servers started on free ports, and helpers to wait on conditions."""
