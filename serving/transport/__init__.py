"""How requests reach the data plane: REST (``rest``, with its OpenAPI document) and gRPC
(``rpc``), both answering errors as ``responses`` says, the HTTP server, and several worker
processes sharing one port (``workers``, ``handoff``)."""
