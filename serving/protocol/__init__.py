"""The messages: the Open Inference Protocol's REST codec (``v2``), messages that do not parse
(``wire``), the escalation budget the registry grants (``budget``); and the gRPC keepalive
policy both ends of a channel share (``keepalive``). The gRPC stubs are ``serving.gen``."""
