"""A conversation: its messages, the chat template, the chat loop and its saved transcripts."""
