"""Backends: the durable key-value maps a store's records are laid out on (``stores.backend``)."""
