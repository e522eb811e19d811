"""Shared core of the latency-model services: wire schemas, features, model artifacts, settings."""
