"""Serving certificates: files followed on disk, and the webhook's self-managed certificate
in a Secret."""
