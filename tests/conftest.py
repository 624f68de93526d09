import pytest


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: one thread is faster and immune to a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def hf():
    """A tiny, seeded, random Kyutai STT model (transformers reference), window 8."""
    from asr.engine.kyutai import tiny_hf_model

    return tiny_hf_model(seed=0, window=8)
