"""A real MCP server, written with the official SDK, for tests/test_mcp_tools.py: a shop's stock
over stdio (default) or streamable HTTP (`--http PORT`)."""
import sys

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("inventory", log_level="ERROR")
STOCK = {"red shoes": 3, "blue hat": 0}


@app.tool()
def check_stock(item: str) -> str:
    """How many of an item the shop has in stock.

    Args:
        item: the item's name
    """
    if item not in STOCK:
        raise ToolError(f"we do not sell {item}")  # its message reaches the client
    return f"{STOCK[item]} {item} in stock"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        app.run("streamable-http", port=int(sys.argv[2]), host="127.0.0.1")
    else:
        app.run()
