"""The model's own chat template from GGUF metadata, rendered with jinja2 as transformers does."""

from __future__ import annotations

import json
from datetime import date

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pocketspec.errors import UserError

# Used only when a GGUF carries no template: ChatML, what SmolLM2 and Qwen2.5 use.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, **_):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


FALLBACK_NOTE = "the model's GGUF carries no chat template: using ChatML (<|im_start|>role ... <|im_end|>)"


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = ""):
        self.is_fallback = not source  # the caller says FALLBACK_NOTE once
        self.source = source or CHATML_TEMPLATE
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
        environment.filters["tojson"] = _tojson
        try:
            self._template = environment.from_string(self.source)
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise UserError(f"the model's chat template does not parse ({error}); run without --chat") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.exceptions.TemplateError as error:
            raise UserError(f"the model's chat template rejected the conversation: {error}") from None


def template_for(tokenizer) -> ChatTemplate:
    """The chat template stored in the model's GGUF metadata (tokenizer.chat_template)."""
    metadata = tokenizer.metadata()
    return ChatTemplate(
        metadata.get("tokenizer.chat_template"),
        bos_token=tokenizer.piece(tokenizer.bos_token, special=True).decode("utf-8", "replace") if tokenizer.bos_token >= 0 else "",
        eos_token=tokenizer.piece(tokenizer.eos_token, special=True).decode("utf-8", "replace") if tokenizer.eos_token >= 0 else "",
    )


def encode_chat(tokenizer, template: ChatTemplate, messages: list[dict[str, str]],
                max_tokens: int | None = None) -> list[int]:
    """Tokens of the rendered conversation, ending with the assistant's generation prompt. max_tokens: the most
    the caller accepts; a longer conversation may return only its first part's tokens (Tokenizer.encode)."""
    text = template.render(messages)
    add_bos = tokenizer.adds_bos and not (template.bos_token and text.startswith(template.bos_token))
    return tokenizer.encode(text, add_bos=add_bos, parse_special=True, max_tokens=max_tokens)


def encode_prompt(tokenizer, template: ChatTemplate, text: str, *, chat: bool,
                  max_tokens: int | None = None) -> list[int]:
    """Prompt tokens for `text`: one user message in the chat template, or the raw text (max_tokens: as
    encode_chat's)."""
    if chat:
        return encode_chat(tokenizer, template, [{"role": "user", "content": text}], max_tokens)
    return tokenizer.encode(text, add_bos=tokenizer.adds_bos, parse_special=False, max_tokens=max_tokens)
