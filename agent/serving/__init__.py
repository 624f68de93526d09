"""The server around the conversations: HTTP and WebSocket wiring, admission and load,
metrics, holding and public errors, and the `duplex` command line."""
