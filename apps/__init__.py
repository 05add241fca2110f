"""Command-line apps built on the pocketspec and memplanner libraries."""

# Each module here exposes COMMANDS, a list of click commands added to `pocketspec`.
COMMAND_MODULES: list[str] = ["generate_cmd", "bench.command", "models_cmd", "doctor_cmd", "plan_cmd", "chat_cmd", "serve_cmd"]
