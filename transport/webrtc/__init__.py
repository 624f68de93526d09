"""The browser over WebRTC (aiortc): Opus audio tracks both ways, events on a data channel."""
