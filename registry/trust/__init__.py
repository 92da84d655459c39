"""Who may say what: the signing keys, the fleet's CA, TUF release metadata, the signed heads
that anchor the audit chain, the nodes' audit witnesses, and a new node's provisioning bundle."""
