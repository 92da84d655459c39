"""The sync protocol (sync.proto) and its node side: the subscriber that receives releases,
downloads and verifies them, and acknowledges. The registry serves the other end
(``registry.server.service``)."""
