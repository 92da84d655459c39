"""The messages: the Open Inference Protocol's REST codec (``v2``), messages that do not parse
(``wire``), the escalation budget the registry grants (``budget``). The gRPC stubs are
``serving.gen``."""
