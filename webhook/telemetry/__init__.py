"""JSON log lines and Prometheus metrics."""
