"""What an integrator builds an agent with: `Agent`, `@function_tool`, `end_call`, MCP servers.
Below the conversation: it imports nothing of it."""
