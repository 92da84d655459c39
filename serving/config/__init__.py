"""Settings every tier shares, node tokens and the registry secret, and the click flags generated
from the settings."""
