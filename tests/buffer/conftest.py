import pytest


@pytest.fixture(autouse=True)
def _hf_cache_in_tmp(tmp_path_factory, monkeypatch):
    """Keep the Arrow cache that load_dataset writes out of ~/.cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
