"""A chat, however it is shown: the session, its saved history, the plain REPL."""
