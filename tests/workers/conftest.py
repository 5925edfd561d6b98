from tests.serving.conftest import tiny_tts

__all__ = ["tiny_tts"]
