"""Chat models: the ChatModel protocol, the embedded llama.cpp backend and bundled GGUFs."""
from llm.base import ChatModel, Message

__all__ = ["ChatModel", "Message", "load_chat_model"]


def load_chat_model(name: str = "qwen2.5-0.5b", **kwargs) -> ChatModel:
    """`name` is a bundled model (smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b) or a .gguf path."""
    from llm.bundled import resolve
    from llm.llamacpp import LlamaCppChat

    return LlamaCppChat(str(resolve(name)), name=name, **kwargs)
