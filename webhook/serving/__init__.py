"""The server: gunicorn's master with asyncio workers, the connection layer, TLS, the Flask routes, file
reloads and the certificates it can make for itself."""
