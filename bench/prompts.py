"""Prompts of about N tokens that do not share KV blocks by accident.

Every word below is one token (with its leading space) in the Qwen vocabulary the demo model uses,
so a prompt of N words is about N prompt tokens before the chat template adds its own. Each
request draws its words from its own PRNG stream, so two requests share nothing past the
template's preamble unless a shared prefix is asked for (``shared_prefix_tokens``), which models a
common system prompt and lets KV-aware routing and prefix caching show their effect.
"""

from __future__ import annotations

import random

WORDS = (  # noqa: SIM905 - a word list reads better as one string than as 200 quoted words
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office door health person "
    "art war history party result change morning reason research girl guy moment air teacher force education "
    "river garden apple stone light bread music window paper green small large quick brown happy early late "
    "open simple strong"
).split()


class PromptFactory:
    """Hands out distinct prompts; one factory per run, so later levels never repeat earlier prompts."""

    def __init__(self, prompt_tokens: int, *, shared_prefix_tokens: int = 0, seed: int | None = None):
        if prompt_tokens <= 0:
            raise ValueError("prompt_tokens must be positive")
        self.prompt_tokens = prompt_tokens
        self.shared_prefix_tokens = min(max(0, shared_prefix_tokens), prompt_tokens)
        self.seed = random.randrange(1 << 30) if seed is None else seed
        self._next = 0
        prefix_rng = random.Random(self.seed ^ 0x5EED)
        self._prefix = " ".join(prefix_rng.choices(WORDS, k=self.shared_prefix_tokens))

    def next_prompt(self) -> str:
        rng = random.Random(self.seed * 1_000_003 + self._next)
        self._next += 1
        tail = " ".join(rng.choices(WORDS, k=self.prompt_tokens - self.shared_prefix_tokens))
        return f"{self._prefix} {tail}" if self._prefix and tail else self._prefix or tail


class ImagePromptFactory(PromptFactory):
    """Each prompt is a distinct random 224x224 PNG (64 tokens on the demo vision model) followed by its text.

    ``next_prompt`` returns the message's content parts (``loadgen.chat_body`` takes them as they are).
    """

    def next_prompt(self) -> list[dict]:  # type: ignore[override]
        import base64
        import io

        from PIL import Image

        rng = random.Random(self.seed * 1_000_003 + self._next)
        out = io.BytesIO()
        Image.frombytes("RGB", (224, 224), rng.randbytes(224 * 224 * 3)).save(out, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
        return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": super().next_prompt()}]
