"""``registry publish``: a release built from the user's model (load, validate, export,
quantize, calibrate) and recorded, and ``registry pull``."""
