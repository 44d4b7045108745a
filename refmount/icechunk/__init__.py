"""Icechunk repositories as a source of references."""
