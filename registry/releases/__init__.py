"""The release catalog (models, versions, aliases, each node's desired releases) and the wave
rollouts that move a new version through the fleet behind quality gates."""
