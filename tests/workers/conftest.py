from tests.serving.conftest import persona_tts, tiny_tts

__all__ = ["persona_tts", "tiny_tts"]
