"""`duplex asr-serve`: the Kyutai-protocol WebSocket server over the engine or Whisper."""
