"""loopd's test kit."""
