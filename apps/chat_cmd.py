"""`pocketspec chat`: a conversation in the terminal, or one answer to a message piped into stdin."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from apps.chat_repl import Repl, stats_line, stop_note
from apps.flags import (backend_options, is_given, model_choice_options, runtime_options, sampling_options,
                        session_settings, setting_option)
from apps.terminal import note, progress_line
from apps.text_input import as_text, prompt_bytes_limit, read_piped_stdin
from pocketspec.models.catalog import models_dir
from pocketspec.conversation.chat import Chat
from pocketspec.conversation.chat_template import FALLBACK_NOTE
from pocketspec.conversation.conversation import Conversation, Replayed, assistant_record, header_record
from pocketspec.errors import UserError
from pocketspec.session import open_session
from pocketspec.settings import BACKENDS, SELF_DRAFTS, GenerationSettings
from pocketspec.speculation.verify_mode import verify_label
from pocketspec.conversation.transcript import (TranscriptWriter, check_appendable, check_not_in_use, find_transcript,
                                               load_transcript, new_transcript_path)

NUM_MESSAGES_SHOWN_ON_RESUME = 6


def _model_name(path: Path | None, drafter: str) -> str:
    """What the transcript header records: a catalog name for pulled models, else the file's path."""
    if path is None:
        return drafter
    return path.stem if path.parent.resolve() == models_dir().resolve() else str(path)


def _drafting_label(session) -> str:
    """What drafts in this chat: the draft model only where the loader loaded it (it skips a pair's draft that
    cannot pay on this machine), else the n-gram drafter, else none."""
    engine = session.engine
    if engine.model is not None:
        return _model_name(session.choice.draft_path, session.choice.drafter)
    return "ngram" if engine.ngram is not None else "none"


def _resumed_backend(replayed: Replayed, path: Path, default: str) -> str:
    """The backend the transcript's chat ran on; older transcripts name none."""
    backend = replayed.header.get("backend", default)
    if backend not in BACKENDS:
        raise UserError(f"{path}: its header names backend {backend!r}, not one of {', '.join(BACKENDS)}; "
                        "give --backend")
    return backend


def _resumed_draft(replayed: Replayed, path: Path, backend: str) -> str | None:
    """What drafted in the transcript's chat; a self-draft only where --backend still names torch."""
    draft = replayed.header.get("draft")
    if draft in SELF_DRAFTS and backend != "torch":
        raise UserError(f"{path}: its chat drafted with {draft}, which runs on --backend torch only; give --draft "
                        f"to choose another drafter for --backend {backend}"
                        + ("" if is_given("backend") else ", or --backend torch"))
    return draft


def _show_history(replayed: Replayed, path: Path) -> None:
    turns = replayed.conversation.turns
    note(f"resumed {len(turns)} messages from {path}")
    if len(turns) > NUM_MESSAGES_SHOWN_ON_RESUME:
        note(f"({len(turns) - NUM_MESSAGES_SHOWN_ON_RESUME} earlier messages not shown)")
    for message in turns[-NUM_MESSAGES_SHOWN_ON_RESUME:]:
        if message.role == "user":
            click.echo(f"> {message.content}")
        else:
            click.echo(message.content)
            if message.is_cut:
                note("[reply cut]")


def _answer_piped(chat: Chat, session, message: str, show_stats: bool) -> None:
    """Scripts: the reply alone on stdout; notes and stats on stderr."""
    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    turn = chat.reply(message, on_text=write, on_note=note)
    write("\n")
    stop = stop_note(turn, chat.max_new_tokens)
    if stop is not None and turn.stop_reason != "max_tokens":
        note(stop)
    if show_stats:
        note(stats_line(turn.stats, session))


@click.command()
@model_choice_options
@click.option("--system", "system_prompt", default=None, help="System prompt (default: the chat template's own, if any).")
@click.option("--resume", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Continue a transcript: a path, or a file name in POCKETSPEC_HOME/chats/ (.jsonl may be left off). "
                   "Its models and backend run again unless --target, --pair or --backend name others.")
@setting_option("--max-tokens", GenerationSettings, "max_reply_tokens", show_default=True,
                help="Longest reply, in tokens.")
@sampling_options
@runtime_options
@backend_options
@click.option("--stats/--no-stats", "show_stats", default=True, help="A stats line after each reply (/stats toggles it).")
def chat(target, draft, pair, system_prompt, resume, max_tokens, temperature, top_p, top_k, seed,
         gamma, memory_budget, max_context, kv_type, threads, repack, exact_verify, show_stats, **backend_args):
    """Chat with a model; with stdin piped in, answer it as one message and exit.

    Every turn is appended to a JSONL transcript under POCKETSPEC_HOME/chats/.
    """
    is_interactive = sys.stdin is not None and sys.stdin.isatty()
    if resume is not None:
        resume = find_transcript(resume)
        check_not_in_use(resume)
        check_appendable(resume)
    replayed = load_transcript(resume) if resume is not None else None
    if replayed is not None and replayed.header and target is None and pair is None:
        # the transcript's target, and its draft unless --draft names another (the draft was the target's), on
        # its backend unless --backend names another (a self-draft runs on torch only)
        if not is_given("backend"):
            backend_args["backend"] = _resumed_backend(replayed, resume, backend_args["backend"])
        target, draft = replayed.header.get("target"), draft or _resumed_draft(replayed, resume, backend_args["backend"])
    message = None
    if not is_interactive:
        message = read_piped_stdin(prompt_bytes_limit(max_context)).strip()
        if not message:
            raise UserError("stdin is empty: pipe a message in, or run `pocketspec chat` in a terminal")
    proposed_path = resume or new_transcript_path()  # before loading: a home it cannot use stops it early
    settings = session_settings(
        target=target, draft=draft, pair=pair, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        gamma=gamma, memory_budget=memory_budget, max_context=max_context, kv_type=kv_type, threads=threads,
        repack=repack, exact_verify=exact_verify, max_new_tokens=max_tokens, pull_if_missing=True, **backend_args)
    with open_session(settings, on_note=note, on_progress=progress_line()) as session:
        # the header names what drafts here: a pair's draft model the loader left out is not named, or a
        # --resume would load it as one named with --draft
        header = header_record(target=_model_name(session.choice.target_path, "none"), draft=_drafting_label(session),
                               backend=backend_args["backend"])
        with TranscriptWriter(proposed_path, is_new=replayed is None) as transcript:
            transcript_path = transcript.path  # a new chat's: the proposed name, or a numbered one beside it
            if transcript.set_aside is not None:
                note(f"{transcript_path}: its last line was cut mid-write; cut it off and kept the original "
                     f"as {transcript.set_aside}")
            if replayed is None:
                transcript.append(header)
            elif replayed.unfinished_reply is not None:
                # The process died mid-reply: what was shown stays in the history, marked cut.
                transcript.append(assistant_record(replayed.unfinished_reply, is_cut=True, stop_reason="killed"))
            conversation = replayed.conversation if replayed is not None else Conversation()
            chat_ = Chat(session.engine, conversation, max_new_tokens=max_tokens, transcript=transcript,
                         stats_for=session.stats_dict,
                         num_earlier_replies=replayed.num_replies if replayed is not None else 0)
            if chat_.template.is_fallback:
                note(FALLBACK_NOTE)
            if system_prompt is not None:
                chat_.set_system(as_text(system_prompt, "--system"))
            if not is_interactive:
                _answer_piped(chat_, session, message, show_stats)
                return
            verify = "" if header["draft"] == "none" else f", verify: {verify_label(session.engine.is_exact_verify)}"
            note(f"chat with {header['target']} (draft: {header['draft']}{verify}), context {chat_.max_context} "
                 "tokens; /help for commands, Ctrl-D or /exit to quit")
            note(f"transcript: {transcript_path}")
            if replayed is not None:
                _show_history(replayed, transcript_path)
            from apps.chat_prompt import terminal_prompt  # only here: piped stdin needs no prompt_toolkit

            Repl(chat_, session, terminal_prompt(note), show_stats=show_stats, header=header).run()


COMMANDS = [chat]
