"""Chat models: the ChatModel protocol, the embedded llama.cpp backend and bundled GGUFs, and
OpenAI-compatible endpoints."""
from llm.base import ChatModel, Message

__all__ = ["ChatModel", "Message", "load_chat_model"]


def load_chat_model(name: str = "qwen2.5-0.5b", model: str | None = None, n_threads: int | None = None,
                    **kwargs) -> ChatModel:
    """`name` is a bundled model (smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b), a .gguf path, or
    the URL of an OpenAI-compatible server (`http://host:port/v1`; `model` names its model)."""
    from llm.openai_compat import OpenAICompatChat, is_endpoint

    if is_endpoint(name):
        return OpenAICompatChat(name, model=model, **kwargs)
    from llm.bundled import resolve
    from llm.llamacpp import LlamaCppChat

    return LlamaCppChat(str(resolve(name)), name=name, n_threads=n_threads, **kwargs)
