"""Fakes for the test tree (a pynvml stand-in)."""
