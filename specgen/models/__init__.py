"""Models on disk: the registry (models.yaml), Hub downloads, GGUF files, the embedded demo
pair, and the one resolver from names and paths to files."""
