"""Chat models: the ChatModel protocol, the embedded llama.cpp backend and bundled GGUFs,
OpenAI-compatible endpoints, and local transformers models (`hf:NAME`)."""
from llm import bundled
from llm.base import ChatModel, Message

__all__ = ["ChatModel", "Message", "load_chat_model"]


def load_chat_model(name: str = bundled.DEFAULT, model: str | None = None, n_threads: int | None = None,
                    **kwargs) -> ChatModel:
    """`name` is a bundled model (a name in `llm.bundled.BUNDLED`), a .gguf path, the
    URL of an OpenAI-compatible server (`http://host:port/v1`; `model` names its model), or
    `hf:` and a transformers model (hub id, directory, .gguf or bundled name)."""
    from llm.openai_compat import OpenAICompatChat, is_endpoint
    from llm.transformers_chat import PREFIX, TransformersChat, is_transformers

    if is_endpoint(name):
        return OpenAICompatChat(name, model=model, **kwargs)
    if is_transformers(name):
        return TransformersChat(name[len(PREFIX):], **kwargs)
    from llm.bundled import resolve
    from llm.llamacpp import LlamaCppChat

    return LlamaCppChat(str(resolve(name)), name=name, n_threads=n_threads, **kwargs)
