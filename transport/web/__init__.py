"""The browser transport: a page, its wire protocol (Sans-I/O) and an asyncio WebSocket shell."""
