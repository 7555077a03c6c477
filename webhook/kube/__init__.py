"""Talking to the apiserver: one client (credentials found as kubectl finds them), the informers that keep
the cluster view current, and the audit's Lease."""
