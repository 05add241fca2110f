"""Command-line apps built on the pocketspec and memplanner libraries."""

# Each module here exposes COMMANDS, a list of click commands added to `pocketspec`.
COMMAND_MODULES: list[str] = ["generate_cmd", "bench"]
COMMAND_MODULES += ["models_cmd", "doctor_cmd"]
COMMAND_MODULES += ["plan_cmd"]
COMMAND_MODULES += ["chat_cmd"]
