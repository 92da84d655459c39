"""What both tiers serve, in layers, each importing only the ones after it (the import-linter
contract in pyproject.toml): ``cli``; ``transport`` (REST, gRPC, workers); ``process``;
``dataplane``; ``fleet``; ``runtime``; ``telemetry``; ``protocol``, ``release`` and ``gen``;
``model`` and ``config``; ``errors`` and ``tasks``."""
