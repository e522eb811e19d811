"""The training server: ingests samples, keeps a stratified window, retrains and publishes models."""
