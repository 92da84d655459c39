"""Example releases built from real data that PyPI packages ship."""
