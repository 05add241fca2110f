"""A session's prompts in its model's chat template: what Session and BatchSession share of text to tokens."""

from __future__ import annotations

from functools import cached_property

from pocketspec.conversation.chat_template import encode_chat, encode_prompt, template_for


class PromptEncoding:
    """Mixed into a session that has a `tokenizer`."""

    tokenizer: object

    @cached_property
    def template(self):
        """The model's own chat template (ChatML when it has none: template.is_fallback)."""
        return template_for(self.tokenizer)

    def encode(self, text: str, *, chat: bool) -> list[int]:
        """Prompt tokens for `text`: as one user message in the chat template, or as raw text."""
        return encode_prompt(self.tokenizer, self.template, text, chat=chat)

    def encode_messages(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_chat(self.tokenizer, self.template, messages)
