"""Test support: the suite's pytest guard, the tiny- and toy-pair makers, and the maintainer script
that trains the embedded pairs in models/ (make_tiny_pair).

Production layers never import this package (an import-linter contract holds it).
"""
