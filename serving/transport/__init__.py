"""How requests reach the data plane: REST (``rest``, with its OpenAPI document) and gRPC
(``rpc``), the HTTP server, and several worker processes sharing one port (``workers``,
``handoff``)."""
