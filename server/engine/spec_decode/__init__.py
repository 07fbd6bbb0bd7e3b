"""Speculative decoding: proposers guess the next tokens cheaply, one target forward checks them all, and
rejection sampling keeps the output distribution the target's own."""
