"""Test support: the suite's pytest guard and the tiny-pair makers.

Production layers never import this package (an import-linter contract holds it).
"""
