"""MCP servers the tests start, written on the ``mcp`` SDK's own server side."""
