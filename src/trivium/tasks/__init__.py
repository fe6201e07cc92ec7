"""Task sets made here (synthetic data for tests and tiny runs); reading task files lives in ``buffer``."""

from trivium.tasks.word_problems import corpus, generate_rows, write_word_problems

__all__ = ["corpus", "generate_rows", "write_word_problems"]
