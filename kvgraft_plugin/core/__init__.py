"""What every layer shares: the exception tree, the configuration, sampling settings, the model catalogue,
the saved-state file format and the `Backend` protocol. Imports nothing else of the package."""
